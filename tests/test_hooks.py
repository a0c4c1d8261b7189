"""Issue 33 item 2: the rules of a run are hooks; a user's hook sees every event of the run in order."""
import os

import pytest
import torch
from conftest import TINY_SIZES, tiny_shapes_pair

from encoding.engine import Hook, RunFailed, TrainingConfig, run_training
from encoding.engine.hooks import Checkpointer, StopOnSignal, default_hooks
from encoding.utils.checkpoint import CHECKPOINT_NAME, load_checkpoint


def _config(out, **options):
    values = dict(output_dir=str(out), workers=0, batch_size=4, epochs=2, train_limit=8, val_limit=4, **TINY_SIZES)
    return TrainingConfig(**{**values, **options})


class Recorder(Hook):
    """Records every event with what the run's state says at that moment."""

    def __init__(self):
        self.events = []

    def before_train(self, state):
        self.events.append(("before_train", state.epoch))

    def before_epoch(self, state):
        self.events.append(("before_epoch", state.epoch))

    def after_step(self, state):
        assert torch.isfinite(torch.tensor(state.step["loss"])) and state.step["lr"] > 0
        self.events.append(("after_step", state.epoch, state.iteration))

    def after_epoch(self, state):
        path = os.path.join(state.run.output_dir, CHECKPOINT_NAME)
        assert not os.path.exists(path) or load_checkpoint(path)["epoch"] == state.epoch - 1  # saved after the hook
        assert set(state.row()) >= {"loss", "lr", "pixAcc", "mIoU"} and state.result["mIoU"] == state.stats["mIoU"]
        self.events.append(("after_epoch", state.epoch))

    def after_train(self, state):
        self.events.append(("after_train", state.error))


def test_a_user_hook_sees_every_event_in_order(tiny_shapes, tmp_path):
    recorder = Recorder()
    result = run_training(_config(tmp_path), tiny_shapes, hooks=[recorder])
    steps = 2  # 8 training samples, batch 4
    expected = [("before_train", 0)]
    for epoch in range(2):
        expected += [("before_epoch", epoch)] + [("after_step", epoch, i) for i in range(1, steps + 1)]
        expected += [("after_epoch", epoch)]
    assert recorder.events == expected + [("after_train", None)]
    assert 0 <= result["mIoU"] <= 1


def test_after_train_runs_when_the_run_fails_and_sees_the_error(tiny_shapes, tmp_path):
    class Diverge(Hook):
        def after_step(self, state):
            raise RunFailed("stop here")

    recorder = Recorder()
    with pytest.raises(RunFailed, match="stop here"):
        run_training(_config(tmp_path), tiny_shapes, hooks=[Diverge(), recorder])
    assert recorder.events[:2] == [("before_train", 0), ("before_epoch", 0)]
    last = recorder.events[-1]
    assert last[0] == "after_train" and isinstance(last[1], RunFailed)
    assert not any(event[0] == "after_step" for event in recorder.events)  # the hook before it stopped the step


def test_a_hook_that_adds_a_number_gets_a_log_column(tiny_shapes, tmp_path):
    class Steps(Hook):
        def after_step(self, state):
            self.done = state.iteration

        def after_epoch(self, state):
            state.stats["steps"] = self.done

    run_training(_config(tmp_path, epochs=1), tiny_shapes, hooks=[Steps()])
    run_dir = _config(tmp_path).run_dir
    with open(os.path.join(run_dir, "log.csv")) as f:
        header, row = f.read().splitlines()[:2]
    assert dict(zip(header.split(","), row.split(",")))["steps"] == "2"  # the user's number is logged and saved
    assert load_checkpoint(os.path.join(run_dir, CHECKPOINT_NAME))["log_row"]["steps"] == 2


def test_the_default_hooks_put_the_rules_in_order_and_the_user_hooks_before_the_stop(tiny_shapes, tmp_path):
    from encoding.engine import build_training

    run = build_training(_config(tmp_path), datasets=tiny_shapes_pair(num_train=8, num_val=4))
    mine = Hook()
    hooks = default_hooks(run, verify_data=True, user=[mine])
    names = [type(h).__name__ for h in hooks]
    assert names == ["VerifyData", "Evaluation", "Hook", "Checkpointer", "EpochLog", "Previews", "ConsoleLine",
                     "CurvePlot", "StopOnSignal"]
    assert hooks[2] is mine and isinstance(hooks[-1], StopOnSignal) and isinstance(hooks[3], Checkpointer)
    assert hooks[-1].checkpointer is hooks[3]  # the stop saves through the one checkpointer
