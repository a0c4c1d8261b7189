"""PyTorch-Encoding compatibility: ``MultiEvalModule``'s PE signature, ``EncodingDeprecationWarning``
and PE's module paths / names (``encoding.nn.syncbn``, ``encoding.utils.files`` / ``pallete`` / ``misc``)."""
import argparse
import re
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import encoding
from encoding.models import MultiEvalModule
from encoding.models.multieval import InferenceOptionError

DOCS = Path(__file__).resolve().parents[1] / "docs"


class TinyNet(nn.Module):
    """A PE-style network: 1x1 logits, with the evaluation sizes PE's ``BaseNet`` stored."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.base_size, self.crop_size = 24, 16

    def forward(self, x):
        return self.conv(x)


# ------------------------------------------------------------------------------------------ MultiEvalModule
@pytest.mark.parametrize("flip", [True, False])
def test_pe_positional_device_ids_flip_is_refused_naming_pe_order(flip):
    """PE's ``MultiEvalModule(module, nclass, device_ids, flip)``: ``flip`` landed on ``crop_size`` (True: 1-pixel
    windows, silently wrong logits)."""
    with pytest.raises(TypeError, match=rf"crop_size must be a positive int, got {flip}.*device_ids, flip, scales"):
        MultiEvalModule(TinyNet(), 4, None, flip, [1.0])


@pytest.mark.parametrize("devices", [["cpu"], [0], (0, 1)])
def test_pe_positional_device_list_is_refused_naming_pe_order(devices):
    with pytest.raises(TypeError, match=r"base_size must be a positive int, got .*PyTorch-Encoding's positional order"):
        MultiEvalModule(TinyNet(), 4, devices)


def test_device_ids_keyword_refused_not_ignored():
    with pytest.raises(InferenceOptionError, match=r"device_ids=\[0\].*evaluate_images") as info:
        MultiEvalModule(TinyNet(), 4, device_ids=[0], scales=[1.0])
    assert isinstance(info.value, ValueError) and isinstance(info.value, encoding.errors.EncodingError)
    assert "\n" not in str(info.value)


def test_device_ids_none_is_pe_default_and_keyword_form_matches():
    image = torch.randn(1, 3, 20, 30)
    net = TinyNet().eval()
    plain = MultiEvalModule(net, 4, flip=False, scales=[0.75, 1.0])(image)
    pe_keywords = MultiEvalModule(net, 4, device_ids=None, flip=False, scales=[0.75, 1.0])
    assert (pe_keywords.base_size, pe_keywords.crop_size) == (24, 16)
    torch.testing.assert_close(pe_keywords(image), plain)


@pytest.mark.parametrize("name, value, error", [
    ("base_size", True, TypeError), ("base_size", 0, InferenceOptionError), ("base_size", 32.0, TypeError),
    ("crop_size", -16, InferenceOptionError), ("crop_size", "16", TypeError), ("nclass", True, TypeError),
    ("nclass", 0, InferenceOptionError), ("stride", True, TypeError), ("stride", 0, InferenceOptionError),
    ("stride_rate", True, InferenceOptionError), ("stride_rate", "0.5", InferenceOptionError),
])
def test_numeric_arguments_refused_with_one_line(name, value, error):
    kwargs = {"module": TinyNet(), "nclass": 4, "scales": [1.0], name: value}
    with pytest.raises(error) as info:
        MultiEvalModule(**kwargs)
    message = str(info.value)
    assert name in message and repr(value) in message and "\n" not in message


def test_numpy_sizes_accepted_as_ints():
    evaluator = MultiEvalModule(TinyNet(), np.int64(4), base_size=np.int64(24), crop_size=np.int32(16),
                                stride=np.int64(8), scales=[1.0])
    assert (evaluator.nclass, evaluator.base_size, evaluator.crop_size, evaluator.stride) == (4, 24, 16, 8)
    assert all(type(v) is int for v in (evaluator.nclass, evaluator.base_size, evaluator.crop_size))


def test_recorded_non_positive_size_refused():
    net = TinyNet()
    net.crop_size = 0
    with pytest.raises(InferenceOptionError, match="crop_size must be a positive int, got 0"):
        MultiEvalModule(net, 4, scales=[1.0])


# ------------------------------------------------------------------------------ EncodingDeprecationWarning
def test_encoding_deprecation_warning_is_the_old_names_category():
    category = encoding.utils.EncodingDeprecationWarning
    assert issubclass(category, FutureWarning)
    with pytest.warns(category, match=r"encoding\.nn\.BatchNorm2d .*is an old name"):
        encoding.nn.BatchNorm2d(4)
    with pytest.warns(FutureWarning):  # a FutureWarning filter still sees it
        encoding.nn.BatchNorm2d(4)


def test_pe_users_filter_silences_old_name_warnings():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warnings.filterwarnings("ignore", category=encoding.utils.EncodingDeprecationWarning)
        encoding.nn.BatchNorm2d(4)
        encoding.utils.get_mask_pallete(np.zeros((2, 2), dtype=np.uint8))
        encoding.datasets.get_dataset  # noqa: B018 (bound, not called)
    assert [str(w.message) for w in caught] == []


def test_misc_module_star_import_as_pe():
    namespace = {}
    exec("from encoding.utils.misc import *", namespace)
    assert namespace["EncodingDeprecationWarning"] is encoding.utils.EncodingDeprecationWarning
    with pytest.warns(encoding.utils.EncodingDeprecationWarning, match=r"use encoding\.utils\.logger\.AverageMeter"):
        meter = namespace["AverageMeter"]()
    meter.update(2, n=2)
    meter.update(4)
    assert (meter.sum, meter.count) == (8, 3) and meter.avg == pytest.approx(8 / 3)


# ------------------------------------------------------------------------------------------ PE module paths
def test_syncbn_module_path_names():
    from encoding.nn.syncbn import BatchNorm1d, BatchNorm2d, BatchNorm3d, DistSyncBatchNorm

    assert (BatchNorm1d, BatchNorm2d, BatchNorm3d) == (encoding.nn.BatchNorm1d, encoding.nn.BatchNorm2d,
                                                        encoding.nn.BatchNorm3d)
    assert DistSyncBatchNorm is encoding.nn.DistSyncBatchNorm
    with pytest.warns(FutureWarning, match=r"encoding\.nn\.syncbn\.BatchNorm2d"):
        layer = BatchNorm2d(3)
    assert isinstance(layer, encoding.nn.SyncBatchNorm)
    with pytest.raises(ValueError, match="4D"):
        layer(torch.randn(2, 3))


def test_files_save_checkpoint_pe_call(tmp_path, monkeypatch):
    from encoding.utils.files import save_checkpoint

    monkeypatch.chdir(tmp_path)
    args = argparse.Namespace(dataset="pascal_voc", model="fcn", backbone="resnet50", checkname="default")
    net = nn.Linear(2, 2)
    with pytest.warns(FutureWarning, match=r"use encoding\.utils\.save_checkpoint"):
        save_checkpoint({"epoch": 1, "state_dict": net.state_dict(), "best_pred": 0.5}, args, True)
    run = tmp_path / "runs" / "pascal_voc" / "fcn" / "resnet50" / "default"
    assert (run / "checkpoint.pth.tar").is_file() and (run / "model_best.pth.tar").is_file()
    saved = torch.load(run / "checkpoint.pth.tar", weights_only=False)
    torch.testing.assert_close(saved["state_dict"]["weight"], net.weight)


def test_pallete_module_path():
    from encoding.utils.pallete import get_mask_pallete

    assert get_mask_pallete is encoding.utils.get_mask_pallete
    namespace = {}
    exec("from encoding.utils.pallete import *", namespace)
    assert namespace["get_mask_pallete"] is get_mask_pallete
    with pytest.warns(FutureWarning):
        image = get_mask_pallete(np.array([[0, 1], [2, 3]], dtype=np.uint8), "pascal_voc")
    assert image.size == (2, 2)


@pytest.mark.parametrize("name", ["`Reduce`", "`get_model_file(name, root)`", "`get_city_pairs(folder, split)`",
                                  "`encoding.models.sseg`", "`encoding.utils.precise_bn`"])
def test_missing_pe_names_are_declared_not_provided(name):
    rows = [line for line in (DOCS / "migration.md").read_text(encoding="utf-8").splitlines()
            if line.startswith("|") and name in line]
    assert rows and all(re.search(r"not provided", row) for row in rows), name
