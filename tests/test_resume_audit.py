"""What a resume and ``--overwrite`` must not get wrong (the resume audit): ``--overwrite`` deletes nothing before
the run can start, never its own input, and replaces the directory's run whenever the checkpoint is another's; a
mid-epoch checkpoint refuses the options that make its epoch (and ``--epochs`` that end before it); an epoch whose
evaluation was interrupted or failed is evaluated, ranked and logged by the resume; every rank resumes its own RNG
state; a folder's hold-out options stay those that drew it; a hook's ``state_dict()`` survives a resume.

Tiny runs of ``train.py`` in process (2 iterations an epoch), and a 2-process gloo group for the RNG states.
"""
import csv
import os
import signal
import socket
from types import SimpleNamespace

import pytest
import torch
import torch.multiprocessing as mp
from conftest import TINY, tiny_shapes_pair
from folder_data import make_folder
from training_runs import SigintAt, run_dir_of, train_tiny

from encoding.engine import Hook, run_training
from encoding.utils import load_checkpoint
from encoding.utils.checkpoint import BEST_NAME, CHECKPOINT_NAME
from encoding.utils.cli import run_cli


def _rows(run_dir):
    with open(os.path.join(run_dir, "log.csv")) as f:
        return list(csv.DictReader(f))


def _files(run_dir):
    """Every file of ``run_dir`` with its content (the lock file aside)."""
    return {name: open(os.path.join(run_dir, name), "rb").read() for name in sorted(os.listdir(run_dir))
            if os.path.isfile(os.path.join(run_dir, name)) and name != ".lock"}


def _one_line(capsys):
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def _train_with_hooks(datasets, out, *extra, hooks=(), epochs=2):
    """A tiny train.py run with ``hooks`` (``run_training(..., hooks=)``): its exit status."""
    from conftest import load_script

    options = load_script("train")
    argv = TINY[:-2] + ["--epochs", str(epochs), "--output-dir", str(out), *extra]
    return run_cli("train.py", lambda a, datasets: run_training(options.training_config(a), datasets, hooks=hooks),
                   argv, datasets=datasets)


# -- --overwrite (bugs 1 and 2) ----------------------------------------------------------------------------------------
def test_overwrite_refuses_to_delete_its_own_resume_file(tiny_shapes, tmp_path, capsys):
    status, checkpoint = train_tiny(tiny_shapes, tmp_path)
    assert status == 0
    before = _files(run_dir_of(tmp_path))
    for extra in (["--ft"], []):  # a fine-tuning of the directory's weights, or a resume of its run
        capsys.readouterr()
        assert train_tiny(tiny_shapes, tmp_path, "--resume", checkpoint, "--overwrite", *extra, epochs=2)[0] == 2
        err = _one_line(capsys)
        assert err.startswith("train.py: error: --overwrite deletes the run in") and f"--resume {checkpoint}" in err
        assert _files(run_dir_of(tmp_path)) == before


def test_overwrite_deletes_nothing_before_the_weights_fit_and_replaces_the_run_of_another_checkpoint(
        tiny_shapes, tmp_path, capsys):
    run_dir = run_dir_of(tmp_path / "runs")
    assert train_tiny(tiny_shapes, tmp_path / "runs", "--lr", "0.01", epochs=2)[0] == 0  # the earlier run
    marker = os.path.join(run_dir, "events.out.tfevents.1.host.1")  # its TensorBoard record
    open(marker, "w").close()
    status, other = train_tiny(tiny_shapes, tmp_path / "other")
    assert status == 0
    before = _files(run_dir)
    # the weights do not fit the network (--aux adds a head): the run fails, the directory's run is untouched
    assert train_tiny(tiny_shapes, tmp_path / "runs", "--ft", "--resume", other, "--overwrite", "--aux")[0] == 1
    assert "does not match" in capsys.readouterr().err
    assert _files(run_dir) == before
    # a resume of another run's checkpoint with --overwrite: the earlier run's files go, nothing of it is mixed in
    assert train_tiny(tiny_shapes, tmp_path / "runs", "--resume", other, "--overwrite", epochs=2)[0] == 0
    rows, theirs = _rows(run_dir), _rows(os.path.dirname(other))
    assert [r["epoch"] for r in rows] == ["0", "1"] and rows[0] == theirs[0]  # the resumed run's row, not the old
    assert not os.path.exists(marker)
    best = os.path.join(run_dir, BEST_NAME)
    assert not os.path.exists(best) or load_checkpoint(best)["args"]["lr"] != 0.01
    assert load_checkpoint(os.path.join(run_dir, CHECKPOINT_NAME))["epoch"] == 1


# -- mid-epoch checkpoints (bugs 3 and 7) ------------------------------------------------------------------------------
def test_a_mid_epoch_checkpoint_refuses_what_reorders_its_epoch_and_epochs_that_end_before_it(tiny_shapes, tmp_path,
                                                                                            capsys):
    status, checkpoint = train_tiny(tiny_shapes, tmp_path)
    assert status == 0
    data = load_checkpoint(checkpoint, map_location="cpu")
    data.update(epoch=0, iteration=1)  # one iteration of epoch 1 done
    torch.save(data, checkpoint)
    refused = {"--seed 2": "with --seed 1", "--train-split val": "with --train-split train",
               f"--data-root {tmp_path}": "with no --data-root", "--epochs 1": "with --epochs 2 or more"}
    for given, expected in refused.items():
        capsys.readouterr()
        assert train_tiny(tiny_shapes, tmp_path, "--resume", checkpoint, "--epochs", "2", *given.split())[0] == 2
        err = _one_line(capsys)
        assert f"error: {given}: {checkpoint} stopped after iteration 1 of epoch 1" in err and expected in err, err
    assert load_checkpoint(checkpoint)["iteration"] == 1  # nothing was trained or written
    assert train_tiny(tiny_shapes, tmp_path, "--resume", checkpoint, epochs=2)[0] == 0
    assert load_checkpoint(checkpoint)["epoch"] == 1


# -- an epoch whose evaluation did not end (bug 4) ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def uninterrupted(shapes_root, tmp_path_factory):
    """A tiny 2-epoch run: (its run directory, the datasets)."""
    out = tmp_path_factory.mktemp("uninterrupted")
    datasets = tiny_shapes_pair(shapes_root)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ENCODING_DATA", str(shapes_root))
        assert train_tiny(datasets, out, epochs=2)[0] == 0
    return run_dir_of(out), datasets


def _checkpoint_state(path):
    saved = load_checkpoint(path, map_location="cpu")
    return saved["epoch"], saved["best_epoch"], saved["best_pred"], saved["model"]


@pytest.mark.parametrize("stop", ["signal", "failure"])
def test_an_epoch_whose_evaluation_did_not_end_is_evaluated_logged_and_ranked_by_the_resume(
        stop, uninterrupted, shapes_root, tmp_path, monkeypatch):
    import encoding.engine.hooks as hooks

    reference, datasets = uninterrupted
    monkeypatch.setenv("ENCODING_DATA", str(shapes_root))
    real = hooks.evaluate

    def evaluate_stopped(*args, **kwargs):  # the evaluation after epoch 0 gets Ctrl-C, or fails on a file
        monkeypatch.setattr(hooks, "evaluate", real)
        if stop == "failure":
            raise OSError("val image unreadable")
        os.kill(os.getpid(), signal.SIGINT)
        return real(*args, **kwargs)

    monkeypatch.setattr(hooks, "evaluate", evaluate_stopped)
    status, checkpoint = train_tiny(datasets, tmp_path, epochs=2)
    assert status == (1 if stop == "failure" else 130)
    assert load_checkpoint(checkpoint)["epoch"] == 0
    assert train_tiny(datasets, tmp_path, "--resume", checkpoint, epochs=2)[0] == 0
    run_dir = run_dir_of(tmp_path)
    assert _rows(run_dir) == _rows(reference)  # epoch 0's row too, with its training loss and rate
    for name in (CHECKPOINT_NAME, BEST_NAME):
        (epoch, best_epoch, best_pred, model), expected = (_checkpoint_state(os.path.join(d, name))
                                                           for d in (run_dir, reference))
        assert (epoch, best_epoch, best_pred) == expected[:3]
        assert all(torch.equal(model[k], expected[3][k]) for k in model)


# -- every rank's RNG state (bug 5) ------------------------------------------------------------------------------------
def _rng_worker(rank, world_size, port, path):
    """Each rank draws from its own RNG (seed 100 + rank), the run saves through the Checkpointer, and each rank
    resumes: its next draws must be what it would have drawn, not rank 0's."""
    import torch.distributed as dist

    from encoding.engine import state
    from encoding.engine.hooks import Checkpointer, RunState
    from encoding.engine.run import resume

    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        model = torch.nn.Linear(2, 2)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        run = SimpleNamespace(model=model, optimizer=optimizer, scheduler=None, scaler=None, options={},
                              output_dir=os.path.dirname(path))
        torch.manual_seed(100 + rank)
        torch.rand(5)
        Checkpointer().write_checkpoint(RunState(run=run), 0)
        expected = torch.rand(3)
        dist.barrier()
        torch.manual_seed(0)  # a new process
        resume(state.read(path), model, optimizer, None, None, 4)
        again = torch.rand(3)
        others = [None] * world_size
        dist.all_gather_object(others, again)
        assert torch.equal(again, expected), f"rank {rank} resumed another rank's RNG state"
        assert not torch.equal(others[0], others[1])
    finally:
        dist.destroy_process_group()


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_every_rank_resumes_its_own_rng_state(tmp_path):
    path = str(tmp_path / CHECKPOINT_NAME)
    mp.spawn(_rng_worker, args=(2, _free_port(), path), nprocs=2, join=True)
    assert len(load_checkpoint(path)["rng_ranks"]) == 2


# -- a folder's hold-out (bug 6) ---------------------------------------------------------------------------------------
def test_a_folder_resume_refuses_hold_out_options_other_than_those_that_drew_it(tmp_path, capsys):
    from encoding.engine import TrainingConfig, state
    from encoding.engine.assemble import check_resume

    root = make_folder(str(tmp_path / "data"), "flat", n_train=10, n_val=0)
    out = tmp_path / "runs"
    base = ["--dataset", "folder", "--data-root", root, "--model", "fcn", "--backbone", "vgg_tiny", "--crop-size",
            "16", "--base-size", "20", "--batch-size", "4", "--workers", "0", "--output-dir", str(out)]
    run_dir = os.path.join(str(out), "folder", "fcn", "default")
    checkpoint, holdout = os.path.join(run_dir, CHECKPOINT_NAME), os.path.join(run_dir, "holdout.json")
    assert run_cli("train.py", lambda a: run_training(_config(a)), base + ["--epochs", "1", "--val-fraction",
                                                                         "0.2"]) == 0
    before = _files(run_dir)
    for given, recorded in (("--val-fraction 0.5", "--val-fraction 0.2"), ("--seed 3", "--seed 1")):
        capsys.readouterr()
        argv = base + ["--epochs", "2", "--val-fraction", "0.2", "--resume", checkpoint, *given.split()]
        assert run_cli("train.py", lambda a: run_training(_config(a)), argv) == 2
        err = _one_line(capsys)
        assert f"error: {given}: {checkpoint} drew its hold-out" in err and f"with {recorded}" in err, err
    assert _files(run_dir) == before
    split = make_folder(str(tmp_path / "split"), "splitdirs")  # its own val split: the seed is free between epochs
    check_resume(TrainingConfig(dataset="folder", data_root=split, seed=3, val_fraction=0.5),
                 state.Checkpoint("ck.pth", {"args": {"seed": 1, "val_fraction": 0.2}}))
    # --overwrite draws a new hold-out with the new share (the earlier run's list is not read)
    assert run_cli("train.py", lambda a: run_training(_config(a)), base + ["--epochs", "1", "--val-fraction", "0.5",
                                                                         "--overwrite"]) == 0
    assert open(holdout).read().count("images/") == 5
    assert load_checkpoint(checkpoint)["args"]["val_fraction"] == 0.5


def _config(argv):
    from conftest import load_script

    return load_script("train").training_config(argv)


# -- a hook's state (8) ------------------------------------------------------------------------------------------------
class _StepCounter(Hook):
    """Counts the steps it saw and sums their losses (logged every epoch): state a resume must give back."""

    def before_train(self, state):
        self.steps, self.losses = 0, torch.zeros(())

    def after_step(self, state):
        self.steps, self.losses = self.steps + 1, self.losses + state.step["loss"]

    def after_epoch(self, state):
        state.stats.update(hook_steps=self.steps, hook_losses=float(self.losses))

    def state_dict(self):
        return {"steps": self.steps, "losses": self.losses}

    def load_state_dict(self, saved):
        self.steps, self.losses = saved["steps"], saved["losses"].clone()


def test_a_hooks_state_survives_a_resume(tiny_shapes, tmp_path):
    assert _train_with_hooks(tiny_shapes, tmp_path / "a", hooks=[_StepCounter()]) == 0
    assert _train_with_hooks(tiny_shapes, tmp_path / "b", hooks=[_StepCounter(), SigintAt(1, 1)]) == 130
    checkpoint = os.path.join(run_dir_of(tmp_path / "b"), CHECKPOINT_NAME)
    assert load_checkpoint(checkpoint)["iteration"] == 1
    assert _train_with_hooks(tiny_shapes, tmp_path / "b", "--resume", checkpoint, hooks=[_StepCounter()]) == 0
    expected, rows = _rows(run_dir_of(tmp_path / "a")), _rows(run_dir_of(tmp_path / "b"))
    assert [r["hook_steps"] for r in rows] == [r["hook_steps"] for r in expected] == ["2", "4"]
    assert [r["hook_losses"] for r in rows] == [r["hook_losses"] for r in expected]


# -- a network option that changes no weight's shape (round 15) --------------------------------------------------------
def test_a_resume_or_eval_builds_the_network_its_weights_trained_in(tiny_shapes, tmp_path, capsys):
    """--output-stride changes no weight: a resume or --eval without it loaded stride-16 weights into the stride-8
    network (psp's own) and went on without a word. Refused, naming both; the same stride, or --ft, is taken."""
    from training_runs import network_checkpoint, run_script
    from encoding.engine import TrainingConfig, state
    from encoding.engine.resuming import check_same_network

    path = network_checkpoint(tmp_path / "psp16.pth")
    base = TINY[:-2] + ["--output-dir", str(tmp_path / "runs"), "--model", "psp", "--backbone", "vgg_tiny",
                        "--resume", path, "--eval"]
    assert run_script("train", base, datasets=tiny_shapes) == 2
    assert _one_line(capsys).endswith(f"error: no --output-stride (psp's own 8): {path} was trained with "
                                      "--output-stride 16, a network of the same weights: pass --output-stride 16")
    assert run_script("train", base + ["--output-stride", "16"], datasets=tiny_shapes) == 0
    checkpoint = state.Checkpoint(path, {"args": {"model": "psp", "output_stride": 16}})
    with pytest.raises(ValueError, match=r"^--output-stride 32: .* pass --output-stride 16, or --ft to start a new"):
        check_same_network(TrainingConfig(model="psp", output_stride=32), checkpoint)
    for saved, given in ((None, 8), (8, None), (16, 16)):  # the architecture's own stride, given or not
        check_same_network(TrainingConfig(model="psp", output_stride=given),
                           state.Checkpoint(path, {"args": {"model": "psp", "output_stride": saved}}))
    with pytest.raises(ValueError, match=r"^no --output-stride \(deeplabv3plus's own 16\)"):
        check_same_network(TrainingConfig(model="deeplabv3plus", output_stride=None),
                           state.Checkpoint(path, {"args": {"model": "deeplabv3plus", "output_stride": 8}}))


def test_an_epoch_scoring_zero_is_still_the_best_so_far(tiny_shapes, tmp_path, monkeypatch):
    """model_best.pth was written only for a score above 0: a run whose epochs all scored 0 (a first epoch on a small
    dataset) left none, and the next command the docs give (test.py --resume .../model_best.pth) failed."""
    from training_runs import train_tiny
    from encoding.engine import hooks
    from encoding.utils.checkpoint import load_checkpoint

    real = hooks.evaluate

    def scoring_zero(*args, **kwargs):
        return {**real(*args, **kwargs), "pixAcc": 0.0, "mIoU": 0.0}

    monkeypatch.setattr(hooks, "evaluate", scoring_zero)
    status, checkpoint = train_tiny(tiny_shapes, tmp_path / "runs", epochs=2)
    best = os.path.join(os.path.dirname(checkpoint), BEST_NAME)
    assert status == 0 and os.path.isfile(best)
    assert load_checkpoint(best)["epoch"] == 0 and load_checkpoint(checkpoint)["best_epoch"] == 0  # the first: 0 > 0
