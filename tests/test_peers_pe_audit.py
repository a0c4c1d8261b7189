"""PyTorch-Encoding calls found broken by an audit, each as PE's scripts or library made it: ``hasattr(model,
'auxlayer')`` in PE's ``train.py``, ``metric.update(labels, preds)`` in its ``test.py`` / ``train_dist.py``, the
the EncNet variant PE built on its PASCAL datasets (said), ``MultiEvalModule`` reading the sizes a model records, the default of
``get_mask_pallete`` and dataset names in any case. CPU only, tiny inputs.
"""
import warnings

import numpy as np
import pytest
import torch
from PIL import Image
from torch import nn

import encoding
from encoding.models import MultiEvalModule, get_segmentation_model
from encoding.models.factory import nclass_of
from encoding.models.network import NetworkSpec
from encoding.utils import SegmentationMetric
from encoding.utils.palette import voc_palette


def _tiny(name="fcn", **kwargs):
    kwargs.setdefault("nclass", 3)
    return get_segmentation_model(name, backbone="vgg_tiny", **kwargs)


# ----------------------------------------------------------------------------------------------------------------------
# 1. model.auxlayer exists only with an auxiliary head (PE's train.py: if hasattr(model, 'auxlayer'): ...)
# ----------------------------------------------------------------------------------------------------------------------
def test_auxlayer_is_absent_without_auxiliary_head_as_in_pe():
    model = _tiny(aux=False)
    assert not hasattr(model, "auxlayer")
    with pytest.raises(AttributeError, match="auxlayer"):
        model.auxlayer
    with_aux = _tiny(aux=True)
    assert with_aux.auxlayer is with_aux.aux_classifier
    for net, groups in ((model, 2), (with_aux, 3)):  # PE's train.py, verbatim in its calls
        params_list = [{"params": net.pretrained.parameters(), "lr": 0.01}]
        if hasattr(net, "head"):
            params_list.append({"params": net.head.parameters(), "lr": 0.1})
        if hasattr(net, "auxlayer"):
            params_list.append({"params": net.auxlayer.parameters(), "lr": 0.1})
        assert len(torch.optim.SGD(params_list, lr=0.01).param_groups) == groups


# ----------------------------------------------------------------------------------------------------------------------
# 2. SegmentationMetric.update(labels, preds): PE's order, taken when unambiguous, with a FutureWarning
# ----------------------------------------------------------------------------------------------------------------------
def _scores(*calls):
    metric = SegmentationMetric(4)
    for preds, target in calls:
        metric.update(preds, target)
    return metric.compute()["confusion"]


def test_metric_update_takes_pe_argument_order_with_a_future_warning():
    torch.manual_seed(0)
    logits, labels = torch.randn(2, 4, 5, 6), torch.randint(-1, 4, (2, 5, 6))
    both, first_image = _scores((logits, labels)), _scores((logits[0], labels[0]))
    # train_dist.py: B x H x W labels, B x C x H x W logits; test.py: lists of H x W labels, 1 x C x H x W logits
    cases = [(labels, logits, both), (labels[0], logits[0], first_image),
             (list(labels), [x.unsqueeze(0) for x in logits], both), (tuple(labels), tuple(logits), both)]
    for first, second, expected in cases:
        metric = SegmentationMetric(4)
        with pytest.warns(FutureWarning, match=r"^SegmentationMetric.update\(labels, preds\) is now "
                                               r"SegmentationMetric.update\(preds, labels\)$") as caught:
            metric.update(first, second)
        assert caught[0].filename == __file__  # points at the caller's line
        assert torch.equal(metric.compute()["confusion"], expected)


def test_metric_update_keeps_todays_behaviour_when_the_order_is_not_pe_beyond_doubt():
    metric = SegmentationMetric(4)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        metric.update(torch.randn(2, 4, 5, 6), torch.randint(0, 4, (2, 5, 6)))  # our order: no warning
        metric.update(torch.randint(0, 4, (2, 5, 6)), torch.randint(0, 4, (2, 5, 6)))  # labels and labels
        with pytest.raises(TypeError, match="argument order"):  # shapes that do not pair
            metric.update(torch.zeros(2, 5, 6, dtype=torch.long), torch.randn(2, 4, 5, 7))
        with pytest.raises(TypeError, match="argument order"):
            metric.update(torch.zeros(2, 5, 6, dtype=torch.bool), torch.randn(2, 4, 5, 6))
        with pytest.raises(TypeError, match="argument order"):  # one pair of the lists is not PE's
            metric.update([torch.zeros(5, 6, dtype=torch.long)] * 2, [torch.randn(1, 4, 5, 6), torch.randn(5, 6)])
        with pytest.raises(TypeError, match="integer labels"):
            metric.update(torch.randn(2, 5, 6), torch.zeros(2, 5, 6, dtype=torch.long))


# ----------------------------------------------------------------------------------------------------------------------
# 3. EncNet's lateral variant: PE's get_encnet chose it on its PASCAL datasets; here one network per description, and
#    a warning where PE built the other
# ----------------------------------------------------------------------------------------------------------------------
def _lateral(build, *args, **kwargs):
    with torch.device("meta"):  # structure only
        return build(*args, **kwargs).classifier.lateral


@pytest.mark.parametrize("dataset, warns", [("pcontext", True), ("pascal_voc", True), ("PContext", True),
                                            ("ade20k", False), ("citys", False)])
def test_encnet_is_the_same_network_on_every_path_and_warns_where_pe_built_the_lateral_one(dataset, warns):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert not _lateral(get_segmentation_model, "encnet", dataset=dataset, backbone="resnet18", se_loss=True)
    said = [str(w.message) for w in caught if "lateral" in str(w.message)]
    assert bool(said) is warns and all("Pass lateral=True for PyTorch-Encoding's network" in m for m in said)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an explicit choice: no warning, and it is built
        assert _lateral(get_segmentation_model, "encnet", dataset=dataset, backbone="resnet18", lateral=True)
    recorded = {"model": "encnet", "backbone": "resnet18", "dataset": dataset.lower(), "aux": True, "se_loss": True}
    assert not _lateral(NetworkSpec.from_options(recorded, nclass_of(dataset)).build)  # train.py's, load_model's


# ----------------------------------------------------------------------------------------------------------------------
# 4. MultiEvalModule reads the sizes and normalisation a model records (PE's BaseNet, PE's test.py --model-zoo)
# ----------------------------------------------------------------------------------------------------------------------
class _PENet(encoding.models.BaseNet):
    def __init__(self, nclass, backbone, **kwargs):
        super().__init__(nclass, backbone, False, False, **kwargs)
        self.head = nn.Conv2d(self.pretrained.channels[3], nclass, 1)

    def forward(self, x):
        return (nn.functional.interpolate(self.head(self.base_forward(x)[3]), x.shape[2:], **self._up_kwargs),)


def test_multieval_reads_the_modules_sizes_and_normalisation():
    torch.manual_seed(0)
    net = _PENet(5, "resnet18", base_size=96, crop_size=64, mean=[.5, .5, .5], std=[.25, .25, .25]).eval()
    evaluator = MultiEvalModule(net, 5, scales=[1.0])
    assert (evaluator.base_size, evaluator.crop_size, evaluator.stride) == (96, 64, 42)
    assert evaluator.pad_value == (-2.0, -2.0, -2.0)
    windows = []
    net.register_forward_hook(lambda module, inputs, output: windows.append(tuple(inputs[0].shape)))
    evaluator(torch.randn(1, 3, 50, 80))
    assert windows == [(1, 3, 64, 64)] * 4  # 60 x 96 at scale 1: two windows, each with its flip
    explicit = MultiEvalModule(net, 5, base_size=40, crop_size=32, mean=(0, 0, 0), std=(1, 1, 1))
    assert (explicit.base_size, explicit.crop_size, explicit.pad_value) == (40, 32, (0, 0, 0))
    # ours: nothing recorded -> PE's defaults; PE's test.py --model-zoo assigns the sizes; load_model's info
    model = _tiny()
    assert (MultiEvalModule(model, 3).base_size, MultiEvalModule(model, 3).crop_size) == (520, 480)
    model.info = encoding.inference.ModelInfo.of_dataset("shapes", base_size=72, crop_size=40)
    assert (MultiEvalModule(model, 3).base_size, MultiEvalModule(model, 3).crop_size) == (72, 40)
    model.base_size = 88
    assert (MultiEvalModule(model, 3).base_size, MultiEvalModule(model, 3).crop_size) == (88, 40)


# ----------------------------------------------------------------------------------------------------------------------
# 5. get_mask_pallete's default dataset, PE's "detail": the VOC colour map over the raw values
# ----------------------------------------------------------------------------------------------------------------------
def test_get_mask_pallete_default_is_pes_voc_rendering():
    values = np.array([[[0, 1, 20, 21], [59, 100, 254, 255]]], dtype=np.int64)  # 1 x H x W, as PE's test.py
    expected = Image.fromarray(values.squeeze().astype("uint8"))
    expected.putpalette([v for rgb in voc_palette(256) for v in rgb])
    with pytest.warns(FutureWarning, match="get_mask_pallete"):
        for image in (encoding.utils.get_mask_pallete(values), encoding.utils.get_mask_pallete(values, "detail")):
            assert image.mode == "P" and np.array_equal(np.array(image), np.array(expected))
            assert np.array_equal(np.array(image.convert("RGB")), np.array(expected.convert("RGB")))
    assert values[0, 0, 3] == 21  # not modified


# ----------------------------------------------------------------------------------------------------------------------
# 6. dataset names in any case, as PE's builders (datasets[dataset.lower()])
# ----------------------------------------------------------------------------------------------------------------------
def test_dataset_names_in_any_case():
    assert nclass_of("PContext") == nclass_of("pcontext") == 59
    assert _tiny(dataset="PContext", nclass=None).classifier[-1].out_channels == 59
    with pytest.raises(ValueError, match="unknown dataset 'Nowhere'"):
        nclass_of("Nowhere")
