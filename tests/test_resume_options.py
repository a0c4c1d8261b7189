"""What a resume honours and what it refuses before any work: a mid-epoch checkpoint and another batch size or
world size, another optimizer, a new weight decay (recorded), and edited training-state counts (issues 24 and 35).
"""
import pytest
import torch
from training_runs import train_tiny

from encoding.models import get_segmentation_model
from encoding.utils import load_checkpoint
from encoding.utils.checkpoint import save_checkpoint


# -- options a resume honours or refuses -------------------------------------------------------------------------------
def _mid_epoch(checkpoint, iteration):
    data = load_checkpoint(checkpoint, map_location="cpu")
    data.update(epoch=-1, iteration=iteration)
    torch.save(data, checkpoint)


def test_a_mid_epoch_checkpoint_refuses_another_batch_size(tiny_shapes, tmp_path, capsys):
    status, checkpoint = train_tiny(tiny_shapes, tmp_path, "--batch-size", "2", "--train-limit", "8")
    assert status == 0
    _mid_epoch(checkpoint, 3)
    capsys.readouterr()
    status = train_tiny(tiny_shapes, tmp_path, "--batch-size", "4", "--train-limit", "8", "--resume", checkpoint)[0]
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and len(err) == 1 and "--batch-size 4" in err[0] and "--batch-size 2" in err[0], err
    assert load_checkpoint(checkpoint)["iteration"] == 3  # nothing was trained or written
    assert train_tiny(tiny_shapes, tmp_path, "--batch-size", "2", "--train-limit", "8", "--resume", checkpoint)[0] == 0
    assert load_checkpoint(checkpoint)["epoch"] == 0


def test_resume_trains_with_the_given_weight_decay_and_records_it(tiny_shapes, tmp_path):
    status, checkpoint = train_tiny(tiny_shapes, tmp_path)
    assert status == 0
    assert train_tiny(tiny_shapes, tmp_path, "--resume", checkpoint, "--weight-decay", "0.5", epochs=2)[0] == 0
    saved = load_checkpoint(checkpoint)
    assert saved["args"]["weight_decay"] == 0.5
    assert {g["weight_decay"] for g in saved["optimizer"]["param_groups"]} == {0.5}


def test_resume_refuses_another_optimizer_before_work(tiny_shapes, tmp_path, capsys):
    status, checkpoint = train_tiny(tiny_shapes, tmp_path)  # the shapes recipe: adamw
    assert status == 0
    capsys.readouterr()
    assert train_tiny(tiny_shapes, tmp_path, "--resume", checkpoint, "--optimizer", "sgd", epochs=2)[0] == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--optimizer sgd" in err[0] and "--optimizer adamw" in err[0] and "--ft" in err[0]
    assert load_checkpoint(checkpoint)["epoch"] == 0


# -- another world size mid-epoch --------------------------------------------------------------------------------------
def _mid_epoch_checkpoint(path, world_size, iteration=7):
    from encoding.engine.state import training_state

    model = get_segmentation_model("unet", dataset="shapes", backbone="vgg_tiny")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    state = training_state(model, optimizer, None, None, epoch=-1, iteration=iteration, best_pred=0.0, best_epoch=-1,
                           args=dict(dataset="shapes", model="unet", backbone="vgg_tiny", batch_size=4,
                                     train_limit=None, optimizer="adamw"), metrics={})
    state["world_size"] = world_size  # the 2-rank run that saved it
    save_checkpoint(state, str(path))
    return str(path)


@pytest.mark.parametrize("saved, now", [(2, 1), (2, 3), (1, 2)])
def test_mid_epoch_checkpoint_resumed_with_another_world_size_is_refused_before_work(saved, now, tmp_path, capsys,
                                                                                     monkeypatch):
    from conftest import TINY, load_script

    from encoding.engine import assemble as engine_config

    path = _mid_epoch_checkpoint(tmp_path / "checkpoint.pth", saved)
    if now > 1:
        monkeypatch.setenv("RANK", "0")
        monkeypatch.setenv("WORLD_SIZE", str(now))
    else:
        monkeypatch.delenv("RANK", raising=False)
    monkeypatch.setattr(engine_config, "build_training", lambda *a, **k: pytest.fail("work started"))
    status = load_script("train").cli(TINY + ["--epochs", "2", "--resume", path, "--output-dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert status == 2 and err.count("\n") == 1
    assert f"with {saved} process(es), this run has {now}" in err


def test_checkpoints_record_the_world_size_and_epoch_ends_resume_anywhere(tmp_path):
    from encoding.engine.state import read, training_state

    model = torch.nn.Linear(2, 2)
    state = training_state(model, torch.optim.SGD(model.parameters(), lr=0.1), None, None, epoch=0, iteration=0,
                           best_pred=0.0, best_epoch=-1, args={}, metrics={})
    assert state["world_size"] == 1
    save_checkpoint(state, str(tmp_path / "c.pth"))
    assert read(str(tmp_path / "c.pth")).world_size_problem(3) is None  # an epoch's end: any world size
    assert read(_mid_epoch_checkpoint(tmp_path / "m.pth", 2)).world_size_problem(2) is None


# -- edited training state ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("key, value", [("iteration", "7"), ("world_size", 0), ("epoch", 2.5), ("args", [1, 2]),
                                        ("best_epoch", True)])
def test_edited_training_state_counts_are_one_line(key, value, tmp_path):
    from encoding.engine.state import read
    from encoding.utils.checkpoint import CheckpointError

    path = _mid_epoch_checkpoint(tmp_path / "checkpoint.pth", 2)
    data = torch.load(path, weights_only=True)
    data[key] = value
    torch.save(data, path)
    with pytest.raises(CheckpointError, match=key) as err:
        read(path)
    assert "\n" not in str(err.value)
