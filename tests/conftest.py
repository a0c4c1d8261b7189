"""Shared pytest configuration and fixtures.

* the ``gpu`` marker skips cleanly on machines without CUDA;
* :func:`tiny_shapes_pair`: a tiny generated ``shapes`` (train, val) pair the tests hand to the run directly
  (``train.main(argv, datasets=...)``, ``encoding.engine.run_training(config, datasets)``);
* fixtures: ``shapes_root`` (one data root per session: each tiny set is generated once), ``tiny_shapes`` (the
  8 / 4 pair there, with ``ENCODING_DATA`` pointing at it) and ``tiny_run`` (one epoch of ``train.py`` on 8 / 5
  scenes, shared by the evaluation-script tests);
* the checkout's ``runs/`` (where ``train.py`` writes by default) is watched for the whole session
  (:class:`runs_guard.RunsGuard`): a suite that creates, changes, deletes, opens or lists anything there fails.
"""
import importlib.util
import os

import pytest
import torch
from runs_guard import RunsGuard

from encoding.datasets import get_segmentation_dataset

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = os.path.join(ROOT, "experiments", "segmentation")
#: train.py options of a tiny run (the sizes are those of :func:`tiny_shapes_pair`).
TINY = ["--crop-size", "32", "--base-size", "40", "--batch-size", "4", "--workers", "0", "--epochs", "1"]
TINY_SIZES = dict(base_size=40, crop_size=32)


#: The user's own runs (``train.py``'s default ``--output-dir``): no test may touch them.
USER_RUNS = os.path.join(ROOT, "runs")


def pytest_sessionstart(session):
    session.config._runs_guard = RunsGuard(USER_RUNS).start()


def pytest_sessionfinish(session, exitstatus):
    guard = getattr(session.config, "_runs_guard", None)
    if guard is None:
        return
    problems = guard.problems()
    guard.stop()
    if problems:
        shown = "\n  ".join(problems[:20]) + (f"\n  ... and {len(problems) - 20} more" if len(problems) > 20 else "")
        session.config._runs_guard_report = f"the suite touched the checkout's runs/ ({USER_RUNS}):\n  {shown}"
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    report = getattr(config, "_runs_guard_report", None)
    if report:
        terminalreporter.section("runs/ guard", red=True)
        terminalreporter.write_line("FAILED " + report)


def same_or_declared_alias(old, target) -> bool:
    """``old`` is ``target``, or the declared old name of it (``encoding.legacy.declare``): a function wrapping it
    or a subclass of it that warns when used, marked ``__deprecated__``."""
    if old is target:
        return True
    if not getattr(old, "__deprecated__", None):
        return False
    return getattr(old, "__wrapped__", None) is target or (isinstance(old, type) and old.__mro__[1] is target)


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="CUDA is not available on this machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


def tiny_shapes_pair(root=None, num_train=8, num_val=4, **options):
    """``(train, val)`` generated ``shapes`` datasets of ``num_train`` / ``num_val`` scenes, built as the ``shapes``
    recipe builds them (crop 32 / base 40, no scale jitter); ``root`` ``None``: ``$ENCODING_DATA``."""
    common = dict(root=None if root is None else str(root), num_train=num_train, num_val=num_val, progress=False,
                  **TINY_SIZES, **options)
    return (get_segmentation_dataset("shapes", split="train", mode="train", scale_range=(1.0, 1.0), **common),
            get_segmentation_dataset("shapes", split="val", mode="val", **common))


def tiny_eval_set(root=None, mode="val", num_val=5):
    """The tiny validation split as ``test.py`` loads it (file names returned) in ``mode``."""
    return get_segmentation_dataset("shapes", root=None if root is None else str(root), split="val", mode=mode,
                                    return_name=True, num_train=8, num_val=num_val, progress=False, **TINY_SIZES)


def load_script(name):
    """``experiments/segmentation/<name>.py`` as a module."""
    spec = importlib.util.spec_from_file_location(f"{name}_script", os.path.join(SCRIPTS, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def shapes_root(tmp_path_factory):
    """One data root for the session's tiny generated sets."""
    return tmp_path_factory.mktemp("shapes_data")


@pytest.fixture
def tiny_shapes(shapes_root, monkeypatch):
    """``ENCODING_DATA`` -> the session's data root; the 8-train / 4-val pair there."""
    monkeypatch.setenv("ENCODING_DATA", str(shapes_root))
    return tiny_shapes_pair(shapes_root)


@pytest.fixture(scope="session")
def tiny_run(shapes_root, tmp_path_factory):
    """One epoch of train.py on 8 train / 5 val scenes: (data root, model_best.pth, the run's last validation)."""
    out = tmp_path_factory.mktemp("tiny_run")
    torch.manual_seed(0)
    result = load_script("train").main(TINY + ["--output-dir", str(out)],
                                       datasets=tiny_shapes_pair(shapes_root, num_val=5))
    return shapes_root, str(out / "shapes" / "unet" / "default" / "model_best.pth"), result


def assert_criterion_is_exact(criterion, net, x, target, devices, split, atol, naive_gap):
    """``criterion`` under DataParallelModel + DataParallelCriterion on ``devices`` (samples split as ``split``)
    gives the loss and the parameter gradients of the whole batch within ``atol``, while PyTorch-Encoding's
    unweighted mean of the per-replica losses is off by more than ``naive_gap`` (the case is a real test)."""
    from encoding.parallel import DataParallelCriterion, DataParallelModel

    single = criterion(net(x), target)
    single.backward()
    expected = [p.grad.clone() for p in net.parameters()]
    net.zero_grad()
    outputs = DataParallelModel(net, devices)(x)
    assert [o["out"].shape[0] for o in outputs] == list(split)
    loss = DataParallelCriterion(criterion, devices)(outputs, target)
    torch.testing.assert_close(loss, single, rtol=0, atol=atol)
    loss.backward()
    for got, want in zip([p.grad for p in net.parameters()], expected):
        torch.testing.assert_close(got, want, rtol=0, atol=atol)
    naive = sum(criterion(o, t) for o, t in zip(outputs, target.split(list(split)))) / len(split)
    assert abs(naive.item() - single.item()) > naive_gap


def assert_replicated_step_is_exact(synced, reference, criterion, x, target, devices, split, atol=1e-10):
    """One training step of ``synced`` under DataParallelModel + DataParallelCriterion on ``devices`` (samples split
    as ``split``) equals ``reference`` on the whole batch: the loss, every parameter's gradient and every buffer
    (BatchNorm statistics; there must be some)."""
    from encoding.parallel import DataParallelCriterion, DataParallelModel

    outputs = DataParallelModel(synced, device_ids=devices)(x)
    assert outputs.split_sizes == split
    loss = DataParallelCriterion(criterion, device_ids=devices)(outputs, target)
    loss.backward()
    plain = criterion(reference(x), target)
    plain.backward()
    torch.testing.assert_close(loss, plain, rtol=1e-10, atol=atol)
    for (name, a), b in zip(synced.named_parameters(), reference.parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-7, atol=1e-10, msg=name)
    buffers = list(zip(synced.named_buffers(), reference.buffers()))
    assert buffers
    for (name, a), b in buffers:
        torch.testing.assert_close(a, b, rtol=1e-10, atol=atol, msg=name)
