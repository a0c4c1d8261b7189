"""encoding.legacy: PyTorch-Encoding conventions implemented once, each old name declared beside its object."""
import ast
import importlib
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

import encoding
from encoding import legacy
from encoding.nn import SegmentationLosses
from encoding.nn import loss as core_loss
from encoding.utils.lr_scheduler import IterationLR
from encoding.utils.metrics import SegmentationMetric


def test_every_pe_name_resolves_to_the_legacy_object():
    for module_name, names in legacy.ALIASES.items():
        module = importlib.import_module(module_name)
        for name, obj in names.items():
            assert getattr(module, name) is obj, (module_name, name)
    for module in (encoding.nn, encoding.utils, encoding.parallel, encoding.utils.metrics, encoding.utils.lr_scheduler):
        aliases = set(legacy.ALIASES[module.__name__]) - {"SegmentationLosses", "OhemCrossEntropy"}
        # the old names are not the packages' API, but where PE's module listed them in its __all__ (PE's tests
        # star-import encoding.utils.metrics)
        star = {"batch_pix_accuracy", "batch_intersection_union", "pixel_accuracy", "intersection_and_union"}
        assert aliases & set(module.__all__) == (star if module is encoding.utils.metrics else set()), module
    for name in ("LR_Scheduler", "LR_Scheduler_Head", "batch_pix_accuracy", "batch_intersection_union",
                 "pixel_accuracy", "intersection_and_union", "get_mask_pallete", "mkdir", "check_sha1"):
        assert getattr(encoding.utils, name) is getattr(legacy, name), name
    # a core object under an old name is a thin layer that warns (the core object itself is untouched)
    assert encoding.nn.DistSyncBatchNorm.__mro__[1] is encoding.nn.SyncBatchNorm
    assert encoding.datasets.get_dataset.__wrapped__ is encoding.datasets.get_segmentation_dataset
    assert encoding.utils.mkdir is legacy.mkdir and encoding.utils.check_sha1 is legacy.check_sha1
    with pytest.raises(AttributeError, match="no attribute 'bogus'"):
        encoding.utils.bogus  # noqa: B018


def test_declaring_is_idempotent_and_never_hides_a_core_object():
    from encoding.legacy.declare import old_name

    assert old_name("encoding.nn")(legacy.View) is legacy.View  # the same declaration again: nothing changes
    assert encoding.nn.BatchNorm2d is legacy.BatchNorm2d
    # one loss class each: encoding.nn's is the core class, which takes PE's layouts itself
    assert encoding.nn.SegmentationLosses is core_loss.SegmentationLosses is legacy.SegmentationLosses
    assert encoding.nn.OhemCrossEntropy is core_loss.OhemCrossEntropy
    assert issubclass(encoding.nn.OhemCrossEntropy, encoding.nn.SegmentationLosses)
    core_bn = encoding.nn.SyncBatchNorm
    for name, bad in (("SyncBatchNorm", legacy.BatchNorm1d), ("Encoding", len)):  # a subclass, a function
        with pytest.raises(RuntimeError, match="would hide it"):
            old_name("encoding.nn", name=name)(bad)
    assert encoding.nn.SyncBatchNorm is core_bn and encoding.nn.Encoding is legacy.EncodingDrop.__mro__[1]
    assert "SyncBatchNorm" not in legacy.ALIASES["encoding.nn"]


def test_old_names_warn_naming_the_new_spelling_when_used():
    target = torch.zeros(1, 2, 2, dtype=torch.long)
    uses = [
        (lambda: encoding.nn.BatchNorm2d(3), "encoding.nn.BatchNorm2d", "encoding.nn.SyncBatchNorm"),
        (lambda: encoding.nn.DistSyncBatchNorm(3), "encoding.nn.DistSyncBatchNorm", "encoding.nn.SyncBatchNorm"),
        (lambda: encoding.nn.PyramidPooling(8, nn.BatchNorm2d), "encoding.nn.PyramidPooling",
         "encoding.models.PyramidPooling"),
        (lambda: encoding.utils.batch_pix_accuracy(torch.zeros(1, 2, 2, 2), target), "batch_pix_accuracy",
         "encoding.utils.SegmentationMetric"),
        (lambda: encoding.datasets.get_dataset("bogus"), "encoding.datasets.get_dataset",
         "encoding.datasets.get_segmentation_dataset"),
    ]
    for use, old, new in uses:
        with pytest.warns(FutureWarning) as caught:
            try:
                use()
            except ValueError:  # get_dataset("bogus"): the warning comes first, then the core's error
                pass
        message = str(caught[0].message)
        assert old in message and f"use {new}" in message, message
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        encoding.nn.SyncBatchNorm(3)
        encoding.nn.SegmentationLosses()(torch.zeros(1, 2, 2, 2), target)
        encoding.nn.View(-1)  # a PE layer with no new spelling: declared, no warning


def test_import_encoding_loads_no_tool_module_and_pe_module_paths():
    """``import encoding`` imports the declaring modules of encoding.legacy (the alias table), the memory planner
    core and PE's module paths ``encoding.functions`` / ``encoding.transforms`` (PE's ``__init__`` imported them),
    never the memory tool's advice / planner / report / CLI / measuring modules nor PE's tuple outputs."""
    code = ("import sys, encoding; print(' '.join(m for m in sys.modules if m.startswith('encoding')))")
    loaded = set(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                                env={**os.environ, "PYTHONWARNINGS": "error::FutureWarning"}).stdout.split())
    lazy = {"encoding.memory.advice", "encoding.memory.planner", "encoding.memory.report", "encoding.memory.cli",
            "encoding.memory.cuda", "encoding.memory.profiler", "encoding.memory.ranks", "encoding.legacy.outputs"}
    assert {"encoding.legacy.declare", "encoding.memory.balance", "encoding.functions", "encoding.transforms",
            "encoding.legacy.functions", "encoding.legacy.transforms"} <= loaded
    assert not lazy & loaded, sorted(lazy & loaded)
    import encoding.memory

    assert callable(encoding.memory.main) and callable(encoding.memory.plan)


def test_no_module_level_getattr_in_the_package():
    """Old names resolve through one table, never a module ``__getattr__`` hook."""
    root = Path(encoding.__file__).parent
    hooks = [str(path.relative_to(root.parent)) for path in sorted(root.rglob("*.py"))
             if any(isinstance(node, ast.FunctionDef) and node.name == "__getattr__"
                    for node in ast.parse(path.read_text(encoding="utf-8")).body)]
    assert hooks == []


def test_core_scheduler_is_torch_style_only():
    opt = torch.optim.SGD([{"params": [torch.zeros(1, requires_grad=True)]},
                           {"params": [torch.zeros(1, requires_grad=True)]}], lr=1.0)
    core = IterationLR(opt, "poly", 0.1, num_epochs=2, iters_per_epoch=3)
    assert not callable(core)  # one driving style: step()
    assert core.get_last_lr() == [0.1, pytest.approx(1.0)] and core.last_epoch == 0
    for _ in range(6):
        opt.step()
        core.step()
    assert core.last_epoch == 6 and core.get_last_lr() == [0.0, 0.0]
    with pytest.raises(TypeError, match="Optimizer"):
        IterationLR(None, "poly", 0.1, 2, 3)
    assert issubclass(legacy.LR_Scheduler, IterationLR)


def test_pe_loss_layouts_are_adapted_to_the_core_call():
    g = torch.Generator().manual_seed(0)
    out, aux, se = torch.randn(2, 3, 4, 4, generator=g), torch.randn(2, 3, 4, 4, generator=g), torch.randn(2, 3)
    target = torch.randint(-1, 3, (2, 4, 4), generator=g)
    named, tgt = legacy.loss_inputs((out, se, aux, target), se_loss=True, aux=True)
    assert tgt is target and named["out"] is out and named["se"] is se and named["aux"] is aux
    criterion = SegmentationLosses(se_loss=True, aux=True)
    core = criterion({"out": out, "aux": aux, "se": se}, target)
    for call in ((out, se, aux, target), ((out, se, aux), target), ([out, se, aux], target)):
        torch.testing.assert_close(criterion(*call), core, rtol=0, atol=0)
    with pytest.raises(ValueError, match=r"\(out, aux\)"):
        legacy.loss_inputs((out, target), se_loss=False, aux=True)
    # one class: the core class takes every layout, with equal values; anything else is refused
    core = core_loss.SegmentationLosses(se_loss=True, aux=True)
    assert type(criterion) is type(core)
    torch.testing.assert_close(core({"out": out, "aux": aux, "se": se}, target), core(out, se, aux, target),
                               rtol=0, atol=0)
    torch.testing.assert_close(core((out, se, aux), target), core(out, se, aux, target), rtol=0, atol=0)
    with pytest.raises(TypeError, match="dict, a tensor or an"):
        core("out", target)
    with pytest.raises(TypeError, match=r"expects \(output, target\)"):
        core(out, "se", aux, target)


def test_metric_targets_are_scattered_like_the_outputs(monkeypatch):
    from encoding.utils import metrics

    calls = []
    real = metrics.scatter
    monkeypatch.setattr(metrics, "scatter", lambda *a, **k: calls.append(k) or real(*a, **k))
    logits, target = torch.randn(5, 3, 2, 2), torch.randint(0, 3, (5, 2, 2))
    metric = SegmentationMetric(3)
    metric.update([logits[:2], logits[2:]], target)
    assert calls == [{"split_sizes": [2, 3]}]
    whole = SegmentationMetric(3)
    whole.update(logits, target)
    assert torch.equal(metric.confusion, whole.confusion)


# ------------------------------------------------------------------ this package's own old paths (encoding.inference)
def _moved():
    """(old module path, its new module) for every module that moved (encoding/legacy/aliases.py)."""
    from encoding.legacy.aliases import MOVED_MODULES

    return [(old, importlib.import_module(new)) for old, new in MOVED_MODULES.items()]


def test_every_old_module_path_holds_the_new_modules_objects():
    for old_path, new in _moved():
        old = importlib.import_module(old_path)
        assert sys.modules[old_path] is old and getattr(encoding.engine, old_path.rsplit(".", 1)[1]) is old
        assert not hasattr(old, "__file__") and old.__spec__.origin is None  # a declaration: no file runs again
        assert old.__all__ == new.__all__
        for name in new.__all__:
            obj, core = getattr(old, name), getattr(new, name)
            if not callable(core) or (isinstance(core, type) and issubclass(core, BaseException)):
                assert obj is core, (old_path, name)  # constants, and exceptions (`except old.Error` catches)
            elif isinstance(core, type):
                assert obj.__mro__[1] is core and f"use {new.__name__}.{name}" in obj.__deprecated__, name
            else:
                assert obj.__wrapped__ is core and f"use {new.__name__}.{name}" in obj.__deprecated__, name
    for name in ("load_model", "ModelInfo", "model_info", "inference_module", "segment", "save_pretrained",
                 "load_pretrained", "push_to_hub"):
        assert name not in encoding.engine.__all__ and name in encoding.inference.__all__
        old, core = getattr(encoding.engine, name), getattr(encoding.inference, name)
        assert (old.__mro__[1] if isinstance(core, type) else old.__wrapped__) is core, name
    assert encoding.load_model is encoding.inference.load_model is encoding.inference.loading.load_model
    assert encoding.segment is encoding.inference.segment is encoding.inference.predict.segment
    assert encoding.engine.config.DIST_TIMEOUT_S is encoding.config.DIST_TIMEOUT_S


def test_old_paths_give_the_same_result_with_one_warning_naming_the_new_path(tmp_path):
    from encoding.engine import config as old_config, demo, error_maps, evaluation_plots, hub, inference, loading
    from encoding.engine import predict, recipes

    labels, target = torch.tensor([[0, 1]]), torch.tensor([[0, 0]])
    uses = [  # (old function, arguments, its new home)
        (loading.to_import, ({"model": "fcn"},), "encoding.inference.loading.to_import"),
        (predict.to_batch, (torch.zeros(3, 4, 5),), "encoding.inference.predict.to_batch"),
        (hub.is_pretrained_source, (str(tmp_path),), "encoding.inference.hub.is_pretrained_source"),
        (demo.demo_outputs, (["a.png"], str(tmp_path)), "encoding.inference.demo.demo_outputs"),
        (inference.prediction_filename, ("a.jpg",), "encoding.inference.evaluation.prediction_filename"),
        (evaluation_plots.iou_order, ([0.5, 0.2], ["a", "b"]), "encoding.inference.evaluation_plots.iou_order"),
        (error_maps.error_kinds, (labels, target), "encoding.inference.error_maps.error_kinds"),
        (old_config.parse_device_ids, ("0,1",), "encoding.engine.assemble.parse_device_ids"),
        (recipes.recipe_file, ("shapes",), "encoding.config.recipes.recipe_file"),
        (encoding.engine.inference_module, (nn.Identity(),), "encoding.inference.inference_module"),
    ]
    for old, args, new in uses:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got = old(*args)
        assert [w.category for w in caught] == [encoding.utils.EncodingDeprecationWarning], \
            (new, [str(w.message) for w in caught])  # PE's class, a FutureWarning: shown by default
        assert str(caught[0].message).endswith(f"; use {new}"), caught[0].message
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            want = old.__wrapped__(*args)
        if isinstance(want, torch.Tensor) or type(want).__module__ == "numpy":
            assert (torch.as_tensor(got) == torch.as_tensor(want)).all(), new
        elif isinstance(want, nn.Module):
            assert type(got) is type(want), new
        else:
            assert got == want, new
    with pytest.warns(FutureWarning, match=r"encoding\.engine\.ModelInfo is an old name.*use encoding\.inference"):
        info = encoding.engine.ModelInfo.of_dataset("shapes")
    assert isinstance(info, encoding.inference.ModelInfo) and info.classes[0] == "background"
    with pytest.raises(predict.InferenceOptionError):  # an old exception name catches what the core raises
        encoding.inference.predict.check_windows(16, 40)


def test_import_encoding_warns_nothing_and_runs_each_moved_file_once():
    code = ("import sys, warnings; warnings.simplefilter('error'); import encoding; "
            "import encoding.engine.loading, encoding.engine.config; from encoding.engine import load_model; "
            "print(' '.join(getattr(m, '__file__', None) or '-' for m in list(sys.modules.values()) "
            "if m.__name__.startswith('encoding.')))")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode == 0 and run.stderr == "", run.stderr
    files = [f for f in run.stdout.split() if f != "-"]
    assert len(files) == len(set(files))  # no file imported under two module names
    moved = [f for f in files if f.endswith(os.path.join("encoding", "inference", "loading.py"))
             or f.endswith(os.path.join("encoding", "engine", "assemble.py"))]
    assert len(moved) == 2, moved
    assert not [f for f in files if os.path.join("encoding", "engine", "loading.py") in f]
