"""Shared pytest configuration and fixtures.

* the ``gpu`` marker skips cleanly on machines without CUDA;
* :func:`tiny_shapes_pair`: a tiny generated ``shapes`` (train, val) pair the tests hand to the run directly
  (``train.main(argv, datasets=...)``, ``encoding.engine.run_training(config, datasets)``);
* fixtures: ``shapes_root`` (one data root per session: each tiny set is generated once), ``tiny_shapes`` (the
  8 / 4 pair there, with ``ENCODING_DATA`` pointing at it) and ``tiny_run`` (one epoch of ``train.py`` on 8 / 5
  scenes, shared by the evaluation-script tests);
* :func:`assert_replicated_step_is_exact`: the one replicated-step exactness check (a model or a criterion under
  DataParallelModel + DataParallelCriterion against the whole batch), with :class:`TwoHeadNet` and
  :func:`uneven_batch` for the criteria;
* the checkout's ``runs/`` (where ``train.py`` writes by default) is watched for the whole session
  (:class:`runs_guard.RunsGuard`): a suite that creates, changes, deletes, opens or lists anything there fails.
"""
import contextlib
import importlib.util
import os


def _share_the_cores() -> None:
    """Each pytest-xdist worker (and every process it starts) runs its share of the CPU cores as intra-op threads.
    Two workers each running torch's default, every core, oversubscribe the machine: CI's 2 cores ran the suite
    about a sixth slower. A thread count given in ``OMP_NUM_THREADS`` is kept."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1 and "OMP_NUM_THREADS" not in os.environ:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1  # macOS
        os.environ["OMP_NUM_THREADS"] = str(max(1, cores // workers))


_share_the_cores()  # before torch is imported: its thread pool reads OMP_NUM_THREADS

import pytest  # noqa: E402
import torch  # noqa: E402
from runs_guard import RunsGuard  # noqa: E402
from torch import nn  # noqa: E402

from encoding.datasets import get_segmentation_dataset  # noqa: E402

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


@contextlib.contextmanager
def intra_op_threads(count):
    """``count`` intra-op threads inside the block (restored after)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@pytest.fixture
def one_thread():
    """One intra-op thread for the test (restored after): real CPU kernels' workspaces depend on the thread count
    (the convolution keeps a buffer per thread that fake tensors cannot see, what ``--calibrate`` learns)."""
    with intra_op_threads(1):
        yield


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


class TwoHeadNet(nn.Module):
    """A tiny segmentation network with an aux head: ``{"out", "aux"}`` logits of ``channels`` channels."""

    def __init__(self, channels, width=8):
        super().__init__()
        self.body = nn.Conv2d(3, width, 3, padding=1)
        self.head = nn.Conv2d(width, channels, 1)
        self.aux = nn.Conv2d(width, channels, 1)

    def forward(self, x):
        feat = torch.tanh(self.body(x))
        return {"out": self.head(feat), "aux": self.aux(feat)}


def uneven_batch(num_classes, seed=0):
    """7 float64 images (3 x 6 x 6) and their targets of ``num_classes`` classes, with ignored pixels (-1) so uneven
    that split 3/2/2 the first replica's samples are mostly ignored: a per-replica mean differs from the batch's."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(7, 3, 6, 6, generator=g, dtype=torch.float64)
    target = torch.randint(0, num_classes, (7, 6, 6), generator=g)
    ignore_rate = torch.tensor([0.9, 0.8, 0.9, 0.1, 0.0, 0.3, 0.05]).view(7, 1, 1)
    target[torch.rand(7, 6, 6, generator=g) < ignore_rate] = -1
    return x, target


def assert_replicated_step_is_exact(synced, reference, criterion, x, target, devices, split, atol=1e-10, *,
                                    rtol=1e-10, grad_rtol=1e-7, grad_atol=1e-10, naive_gap=None):
    """One training step of ``synced`` under DataParallelModel + DataParallelCriterion on ``devices`` (samples split
    as ``split``) equals ``reference`` on the whole batch: the loss (within ``rtol`` / ``atol``), every parameter's
    gradient (``grad_rtol`` / ``grad_atol``) and every buffer (BatchNorm statistics; there must be some).

    ``reference`` may be ``synced`` itself (the criterion is what is tested): its whole-batch step is taken first
    and there are no buffers to compare. With ``naive_gap``, PyTorch-Encoding's unweighted mean of the per-replica
    losses must be off by more than it (the case is a real test)."""
    from encoding.parallel import DataParallelCriterion, DataParallelModel

    plain = criterion(reference(x), target)
    plain.backward()
    expected = [p.grad.clone() for p in reference.parameters()]
    if reference is synced:
        synced.zero_grad()
    outputs = DataParallelModel(synced, device_ids=devices)(x)
    assert outputs.split_sizes == list(split)
    assert [(o["out"] if isinstance(o, dict) else o).shape[0] for o in outputs] == list(split)
    loss = DataParallelCriterion(criterion, device_ids=devices)(outputs, target)
    torch.testing.assert_close(loss, plain, rtol=rtol, atol=atol)
    loss.backward()
    for (name, a), b in zip(synced.named_parameters(), expected):
        torch.testing.assert_close(a.grad, b, rtol=grad_rtol, atol=grad_atol, msg=name)
    if reference is not synced:
        buffers = list(zip(synced.named_buffers(), reference.buffers()))
        assert buffers
        for (name, a), b in buffers:
            torch.testing.assert_close(a, b, rtol=rtol, atol=atol, msg=name)
    if naive_gap is not None:
        naive = sum(criterion(o, t) for o, t in zip(outputs, target.split(list(split)))) / len(split)
        assert abs(naive.item() - plain.item()) > naive_gap
