"""Distributed helpers: single-process fallbacks and a real 2-process gloo run on CPU."""
import json
import os
import socket
import subprocess
import sys
import time

import pytest
import torch
import torch.multiprocessing as mp

from encoding.utils import (MetricLogger, SegmentationMetric, barrier, default_backend, get_rank, get_world_size,
                            init_distributed_mode, is_main_process, reduce_across_processes)
from encoding.utils.dist import end_worker

TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def test_single_process_fallbacks(monkeypatch):
    for name in TORCHRUN_VARS:
        monkeypatch.delenv(name, raising=False)
    assert init_distributed_mode() is False
    assert get_rank() == 0 and get_world_size() == 1 and is_main_process()
    barrier()
    t = torch.tensor([1, 2])
    out = reduce_across_processes(t)
    assert torch.equal(out, t) and out is not t
    assert reduce_across_processes(3) == 3 and reduce_across_processes(2.5, op="mean") == 2.5
    with pytest.raises(ValueError, match="op must be one of"):
        reduce_across_processes(1, op="prod")


def test_incomplete_torchrun_environment(monkeypatch):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    with pytest.raises(RuntimeError, match="MASTER_ADDR"):
        init_distributed_mode()


def test_default_backend(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert default_backend() == "gloo"


def _data(rank):
    g = torch.Generator().manual_seed(100 + rank)
    logits = torch.randn(2 + rank, 5, 6, 7, generator=g)  # uneven: rank 0 has 2 images, rank 1 has 3
    target = torch.randint(-1, 5, (2 + rank, 6, 7), generator=g)
    return logits, target


def _worker(rank, world_size, port, out_dir):
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    assert init_distributed_mode(backend="gloo", timeout_s=60) is True
    assert init_distributed_mode() is True  # idempotent
    try:
        metric = SegmentationMetric(5)
        metric.update(*_data(rank))
        metric.reduce_from_all_processes()
        single = SegmentationMetric(5)
        for r in range(world_size):
            single.update(*_data(r))
        reduced = metric.confusion.clone()
        metric.reduce_from_all_processes()  # a second call reduces the same local counts, not the sum again
        logger = MetricLogger()
        logger.update(loss=float(rank + 1), n=rank + 1)  # rank 0: 1 x 1.0, rank 1: 2 x 2.0
        logger.synchronize_between_processes()
        barrier()
        result = {
            "rank": get_rank(), "world": get_world_size(), "main": is_main_process(),
            "same_confusion": bool(torch.equal(reduced, single.confusion)),
            "same_after_second": bool(torch.equal(metric.confusion, single.confusion)),
            "scores": [metric.get(), single.get()],
            "sum": reduce_across_processes(torch.tensor([rank, 10 * rank])).tolist(),
            "mean": reduce_across_processes(rank + 1, op="mean"),
            "max": reduce_across_processes(float(rank), op="max"),
            "min": reduce_across_processes(torch.tensor(rank + 5), op="min").item(),
            "loss_avg": logger["loss"].global_avg,
        }
        with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
            json.dump(result, f)
    finally:
        torch.distributed.destroy_process_group()
    end_worker(0)  # past the interpreter's teardown, where gloo's threads sometimes abort a finished rank


def _free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_process_gloo(tmp_path):
    mp.spawn(_worker, args=(2, _free_port(), str(tmp_path)), nprocs=2, join=True)
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for r, res in enumerate(results):
        assert res["rank"] == r and res["world"] == 2 and res["main"] == (r == 0)
        assert res["same_confusion"]  # DDP evaluation == single-process evaluation over all data
        assert res["same_after_second"]
        assert res["scores"][0] == res["scores"][1]
        assert res["sum"] == [1, 10] and res["mean"] == 1.5 and res["max"] == 1.0 and res["min"] == 5
        assert res["loss_avg"] == pytest.approx((1 * 1.0 + 2 * 2.0) / 3)


def test_shard_sampler_scores_every_sample_once():
    """Shards of 5 samples over 2 processes: every sample once, no padding (DistributedSampler would yield 6)."""
    from encoding.utils.dist import ShardSampler

    shards = [list(ShardSampler(range(5), rank=rank, world_size=2)) for rank in (0, 1)]
    assert shards == [[0, 2, 4], [1, 3]]
    assert [len(ShardSampler(range(5), rank=rank, world_size=2)) for rank in (0, 1)] == [3, 2]
    assert list(ShardSampler(range(3))) == [0, 1, 2]  # one process: everything, in order


# -- issue 24: a frozen rank ends the job within --dist-timeout -----------------------------------------------------
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: One rank of train.py (RANK etc. in the environment) on the tiny shapes set; rank 1 freezes itself (SIGSTOP) at
#: its second optimizer step, after writing the time into sys.argv[1].
_FROZEN_PEER = (
    "import os, signal, sys, time; sys.path[:0] = ['tests', 'experiments/segmentation']\n"
    "from conftest import tiny_shapes_pair; import train; import encoding.engine.loop as loop\n"
    "stamp = sys.argv.pop(1); real = loop.backward_step; steps = []\n"
    "def step(*args, **kwargs):\n"
    "    steps.append(1)\n"
    "    if os.environ['RANK'] == '1' and len(steps) == 2:\n"
    "        open(stamp, 'w').write(repr(time.time())); os.kill(os.getpid(), signal.SIGSTOP)\n"
    "    return real(*args, **kwargs)\n"
    "loop.backward_step = step\n"
    "sys.exit(train.cli(sys.argv[1:], datasets=tiny_shapes_pair()))")


def test_a_frozen_rank_ends_the_job_within_dist_timeout(tmp_path):
    timeout = 10
    port, stamp = _free_port(), str(tmp_path / "stopped")
    argv = ["--model", "fcn", "--backbone", "resnet18", "--crop-size", "32", "--base-size", "40", "--batch-size",
            "2", "--workers", "0", "--epochs", "1", "--no-val", "--no-cuda", "--output-dir", str(tmp_path / "runs"),
            "--dist-timeout", str(timeout)]
    procs = []
    for rank in range(2):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": str(rank), "OMP_NUM_THREADS": "1",
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "ENCODING_DATA": str(tmp_path / "data")}
        procs.append(subprocess.Popen([sys.executable, "-c", _FROZEN_PEER, stamp, *argv], cwd=ROOT, env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    try:
        out, err = procs[0].communicate(timeout=180)
        ended = time.time()
        assert os.path.exists(stamp), out + err  # rank 1 froze; rank 0 ended on its own
        assert procs[0].returncode != 0 and ended - float(open(stamp).read()) < timeout + 15, out + err
        assert "Timed out" in err, err
    finally:
        for proc in procs:
            proc.kill()  # SIGKILL ends a stopped process too
            proc.communicate()
