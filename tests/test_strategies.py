"""train.py --strategy ddp|fsdp|zero1: each equals single-process training on the whole batch (2 gloo processes,
float64), its checkpoints are full ordinary state dicts that resume exactly, and a run under torchrun writes a
checkpoint that a plain test.py evaluates."""
import copy
import gc
import json
import os
import socket
import subprocess
import sys

import pytest
import torch
import torch.multiprocessing as mp

from conftest import SCRIPTS, TINY, load_script, tiny_eval_set
from encoding.engine import builders
from encoding.engine.loop import autocast_context, backward_step
from encoding.engine.sharding import full_state
from encoding.engine.state import Checkpoint
from encoding.engine.run import resume
from encoding.utils import load_checkpoint, reduce_across_processes, unwrap_model
from encoding.utils.dist import end_worker

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS, BATCH, CROP, NCLASS, TOL = 3, 4, 32, 7, 1e-6
CLIP = 0.5  # below the gradient norms of these steps: every step is clipped by the global norm
CPU = torch.device("cpu")


def _free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _batches(dtype, count=STEPS + 1):
    """Whole batches; every pixel labelled, so each rank's mean loss weighs its pixels as the whole batch does."""
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(BATCH, 3, CROP, CROP, generator=g).to(dtype), torch.randint(0, NCLASS, (BATCH, CROP, CROP),
                                                                                       generator=g))
            for _ in range(count)]


def _model(sync_bn=False):
    """The tiny FCN (vgg_tiny), without dropout: its random masks depend on how the batch is split."""
    model = builders.build_model("fcn", "shapes", backbone="vgg_tiny", sync_bn=sync_bn)
    for module in model.modules():
        if isinstance(module, torch.nn.modules.dropout._DropoutNd):
            module.p = 0.0
    return model


def _parts(model, strategy, dtype):
    """``model`` (its weights copied into a SyncBatchNorm model) wrapped for ``strategy``, its optimizer (SGD,
    momentum, weight decay, two groups at 1x and 10x) and its poly schedule."""
    if strategy is not None:
        synced = _model(sync_bn=True).to(dtype)
        synced.load_state_dict(model.state_dict())
        placement = builders.Placement([], CPU, CPU, True)
        model = builders.wrap_model(synced, builders.build_criterion(NCLASS), placement, strategy=strategy)[0]
    optimizer = builders.build_optimizer(model, 0.05, momentum=0.9, weight_decay=1e-3,
                                         zero_redundancy=strategy == "zero1")
    return model, optimizer, builders.build_scheduler(optimizer, "poly", 0.05, 1, STEPS + 1, head_lr_mult=10.0)


def _step(model, optimizer, scheduler, batch, share, amp=None):
    """One training step on ``share`` of ``batch``; the loss of the whole batch (the mean over the processes)."""
    image, target = (t[share] for t in batch)
    with autocast_context(CPU, amp):
        loss = builders.build_criterion(NCLASS)(model(image), target)
    backward_step(loss, optimizer, clip_grad_norm=CLIP)
    scheduler.step()
    return float(reduce_across_processes(loss.detach().double(), "mean"))


def _difference(a, b):
    """Largest absolute difference between two nestings of tensors / numbers (same structure)."""
    if isinstance(a, dict):
        assert a.keys() == b.keys(), (sorted(a), sorted(b))
        return max([_difference(a[k], b[k]) for k in a] or [0.0])
    if isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        return max([_difference(x, y) for x, y in zip(a, b)] or [0.0])
    if isinstance(a, torch.Tensor):
        return (a.double() - b.double()).abs().max().item() if a.numel() else 0.0
    return 0.0 if a == b else float("inf")


def _states(model, optimizer):
    """The full ordinary (model, optimizer) state dicts of a run (gathered onto rank 0 under fsdp / zero1)."""
    model_state, optimizer_state = full_state(model, optimizer)
    model_state = model_state if isinstance(model_state, dict) else unwrap_model(model_state).state_dict()
    optimizer_state = (optimizer_state if isinstance(optimizer_state, dict) or optimizer_state is None
                       else optimizer_state.state_dict())
    return model_state, optimizer_state


def _strategy(strategy, rank, reference, batches, path):
    """Train ``strategy`` STEPS steps, save its full state (rank 0), resume it into a fresh run, take one more step;
    the differences from the single-process ``reference`` run."""
    share = slice(rank * BATCH // 2, (rank + 1) * BATCH // 2)
    torch.manual_seed(1)
    start = _model().double()
    model, optimizer, scheduler = _parts(start, strategy, torch.float64)
    losses = [_step(model, optimizer, scheduler, batch, share) for batch in batches[:STEPS]]
    model_state, optimizer_state = _states(model, optimizer)
    result = {"loss": max(abs(a - b) for a, b in zip(losses, reference["losses"]))}
    if rank == 0:
        result["model"] = _difference(model_state, reference["model"])  # parameters and BatchNorm statistics
        result["optimizer"] = _difference(optimizer_state, reference["optimizer"])  # ordinary: keyed by position
        torch.save({"model": model_state, "optimizer": optimizer_state, "epoch": -1, "iteration": STEPS}, path)
    torch.distributed.barrier()
    torch.manual_seed(2)  # a fresh run (other weights) resumed from the checkpoint
    model, optimizer, scheduler = _parts(_model().double(),
                                         strategy, torch.float64)
    point = resume(Checkpoint(path, torch.load(path, weights_only=True)), model, optimizer, scheduler, None,
                   STEPS + 1)
    result["resumed_at"] = point.iteration
    result["loss"] = max(result["loss"], abs(_step(model, optimizer, scheduler, batches[STEPS], share)
                                              - reference["last_loss"]))
    model_state, optimizer_state = _states(model, optimizer)
    if rank == 0:
        result["resumed"] = _difference(model_state, reference["resumed"])
    torch.distributed.barrier()
    return result


def _reference(batches):
    """Single-process training on the whole batches: STEPS steps, then one more."""
    torch.manual_seed(1)
    model, optimizer, scheduler = _parts(_model().double(), None,
                                         torch.float64)
    reference = {"losses": [_step(model, optimizer, scheduler, batch, slice(None)) for batch in batches[:STEPS]]}
    reference["model"] = copy.deepcopy(model.state_dict())
    reference["optimizer"] = copy.deepcopy(optimizer.state_dict())  # the step below changes its buffers in place
    reference["last_loss"] = _step(model, optimizer, scheduler, batches[STEPS], slice(None))
    reference["resumed"] = model.state_dict()
    return reference


def _bf16_loss(strategy, rank, batch):
    """The loss of one ``--amp bf16`` step (float32 weights) of ``strategy`` (``None``: one process, whole batch)."""
    torch.manual_seed(1)
    model, optimizer, scheduler = _parts(_model(), strategy,
                                         torch.float32)
    share = slice(None) if strategy is None else slice(rank * BATCH // 2, (rank + 1) * BATCH // 2)
    return _step(model, optimizer, scheduler, batch, share, amp=torch.bfloat16)


def _worker(rank, port, out_dir):
    os.environ.update(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo", rank=rank, world_size=2)
    try:
        batches = _batches(torch.float64)
        reference = _reference(batches)
        results = {strategy: _strategy(strategy, rank, reference, batches, os.path.join(out_dir, f"{strategy}.pth"))
                   for strategy in builders.STRATEGIES}
        batch = _batches(torch.float32, 1)[0]
        results["bf16"] = {str(strategy): _bf16_loss(strategy, rank, batch)
                           for strategy in (None, *builders.STRATEGIES)}
        with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
            json.dump(results, f)
        torch.distributed.barrier()  # no rank tears the group down while the other is still in a collective
    finally:
        gc.collect()  # the wrapped models (FSDP keeps reference cycles) go before their process group, not at exit
        torch.distributed.destroy_process_group()
    end_worker(0)  # past the interpreter's teardown, where gloo's threads sometimes abort a finished rank


def test_each_strategy_equals_single_process_training(tmp_path):
    mp.spawn(_worker, args=(_free_port(), str(tmp_path)), nprocs=2, join=True)
    for rank in range(2):
        results = json.loads((tmp_path / f"rank{rank}.json").read_text())
        print(f"rank {rank}:", json.dumps(results))
        for strategy in builders.STRATEGIES:
            result = results[strategy]
            assert result["loss"] <= TOL and result["resumed_at"] == STEPS, (strategy, result)
            if rank == 0:
                assert max(result["model"], result["optimizer"], result["resumed"]) <= TOL, (strategy, result)
        bf16 = results["bf16"]
        for strategy in builders.STRATEGIES:  # autocast rounds each half of the batch on its own
            assert bf16[strategy] == pytest.approx(bf16["None"], rel=2e-2), bf16


def test_a_strategy_needs_torchrun(monkeypatch, capsys):
    for name in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    assert builders.strategy_problem("ddp") is None
    assert "start it with torchrun" in builders.strategy_problem("fsdp")
    assert "use --amp bf16" in builders.strategy_problem("fsdp", "fp16", distributed=True)
    assert builders.strategy_problem("zero1", "fp16", distributed=True) is None
    with pytest.raises(SystemExit) as stop:
        load_script("train").main(["--strategy", "zero1", "--no-cuda"])
    assert stop.value.code == 2 and "--strategy zero1 shards the run over torchrun processes" in capsys.readouterr().err
    placement = builders.select_devices(["cpu"])
    model = builders.build_model("fcn", "shapes", backbone="vgg_tiny")
    with pytest.raises(ValueError, match="--strategy fsdp shards the run"):
        builders.wrap_model(model, builders.build_criterion(NCLASS), placement, strategy="fsdp")


# Runs train.py on the tiny shapes pair (conftest), one process of a torchrun job.
LAUNCHER = """
import sys
sys.path[:0] = [{tests!r}, {scripts!r}]
from conftest import tiny_shapes_pair
import train
sys.exit(train.cli(sys.argv[1:], datasets=tiny_shapes_pair(num_val=5)))
"""


@pytest.mark.parametrize("strategy", ["fsdp", "zero1"])
def test_torchrun_strategy_writes_a_checkpoint_test_py_evaluates(strategy, shapes_root, tmp_path):
    launcher = tmp_path / "launch_train.py"
    launcher.write_text(LAUNCHER.format(tests=os.path.join(ROOT, "tests"), scripts=SCRIPTS))
    env = {**os.environ, "ENCODING_DATA": str(shapes_root), "OMP_NUM_THREADS": "1"}
    out = tmp_path / "runs"
    # fsdp: previews too, whose forwards gather the sharded weights from both processes (rank 0's alone hung)
    previews = ["--tensorboard", "--log-images", "1"] if strategy == "fsdp" else []
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           str(launcher), *TINY, "--batch-size", "2", "--no-cuda", "--strategy", strategy,
                           "--amp", "bf16", "--dist-timeout", "60", "--output-dir", str(out), *previews],
                          env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"{strategy.upper()} rank 0/2" in done.stdout
    checkpoint = out / "shapes" / "unet" / "default" / "checkpoint.pth"
    if previews:
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
        events = EventAccumulator(str(checkpoint.parent))
        events.Reload()
        assert [e.step for e in events.Images("val/0")] == [0]
    saved = load_checkpoint(checkpoint)
    model = builders.build_model("unet", "shapes", backbone="vgg_tiny", output_stride=8)
    assert saved["model"].keys() == model.state_dict().keys()  # the bare model's keys, plain tensors
    assert all(type(t) is torch.Tensor for t in saved["model"].values())
    assert sorted(saved["optimizer"]["state"]) == list(range(len(list(model.parameters()))))  # ordinary, full
    builders.build_optimizer(model, 0.1, kind="adamw").load_state_dict(saved["optimizer"])  # a plain run's groups
    result = load_script("test").main(["--workers", "0", "--mode", "val", "--amp", "bf16", "--resume", str(checkpoint),
                                       "--out-dir", str(tmp_path / "eval")], data=tiny_eval_set(shapes_root))
    assert result["pixAcc"] == pytest.approx(saved["metrics"]["pixAcc"], abs=1e-6)  # the run's own evaluation
