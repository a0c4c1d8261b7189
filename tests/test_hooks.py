"""Issue 33 item 2: the rules of a run are hooks; a user's hook sees every event of the run in order."""
import os
import re

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

    def before_step(self, state):
        assert set(state.step) == {"loss"} and torch.isfinite(torch.tensor(state.step["loss"]))
        self.events.append(("before_step", state.epoch, state.iteration))

    def after_step(self, state):
        # the rate this step used: 0 at the run's first step (the recipe's linear warm-up starts at 0, PE's), then
        # rising (state.iteration: the steps done in this epoch)
        first = (state.epoch, state.iteration) == (0, 1)
        assert torch.isfinite(torch.tensor(state.step["loss"])) and (state.step["lr"] > 0) != first
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
        expected += [("before_epoch", epoch)]
        expected += [event for i in range(steps) for event in (("before_step", epoch, i), ("after_step", epoch, i + 1))]
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
    assert recorder.events[:3] == [("before_train", 0), ("before_epoch", 0), ("before_step", 0, 0)]
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
    assert names == ["DivergenceCheck", "VerifyData", "Evaluation", "Hook", "Checkpointer", "EpochLog", "Previews",
                     "ConsoleLine", "RunEstimate", "CurvePlot", "StopOnSignal"]
    assert hooks[3] is mine and isinstance(hooks[-1], StopOnSignal) and isinstance(hooks[4], Checkpointer)
    assert hooks[-1].checkpointer is hooks[4]  # the stop saves through the one checkpointer


def test_a_nan_loss_is_refused_by_the_divergence_hook_before_its_step(tiny_shapes, tmp_path):
    """The run keeps no rule of its own: the NaN check is the DivergenceCheck hook, before the backward."""
    class PoisonNextLoss(Hook):  # runs after DivergenceCheck: it sees the finite first loss, poisons the next one
        def before_step(self, state):
            if state.iteration == 0:
                state.run.criterion.register_forward_hook(lambda module, args, out: out * float("nan"))

    recorder = Recorder()
    with pytest.raises(RunFailed, match=r"training diverged in epoch 0 \(loss is nan at epoch 0, iteration 1;"):
        run_training(_config(tmp_path), tiny_shapes, hooks=[PoisonNextLoss(), recorder])
    assert recorder.events[-3:-1] == [("before_step", 0, 0), ("after_step", 0, 1)]  # the NaN step never reached it
    assert isinstance(recorder.events[-1][1], RunFailed)


def test_a_user_hook_refuses_a_step_before_anything_of_it_is_applied(tiny_shapes, tmp_path):
    class Refuse(Hook):
        def before_step(self, state):
            if state.iteration == 1:
                self.weights = [p.detach().clone() for p in state.run.model.parameters()]
                self.model = state.run.model
                raise RunFailed("refused")

    refuse = Refuse()
    with pytest.raises(RunFailed, match="refused"):
        run_training(_config(tmp_path), tiny_shapes, hooks=[refuse])
    assert all(torch.equal(p, w) for p, w in zip(refuse.model.parameters(), refuse.weights))


@pytest.mark.parametrize("failure, one_line", [(KeyError("a bug in the metric"), False),
                                               (OSError(5, "Input/output error", "val/img0.png"), True)])
def test_a_failed_evaluation_saves_the_epoch_and_a_bug_keeps_its_traceback(failure, one_line, tiny_shapes, tmp_path,
                                                                            monkeypatch, capsys):
    """Only what the package explains (an EncodingError, an OSError) becomes the one-line RunFailed; a bug in the
    evaluation propagates as itself (the traceback errors.py promises), after the trained epoch is saved."""
    from encoding.engine import hooks

    def failing(*args, **kwargs):
        raise failure

    monkeypatch.setattr(hooks, "evaluate", failing)
    with pytest.raises(Exception) as caught:
        run_training(_config(tmp_path, epochs=1), tiny_shapes)
    saved = [os.path.join(d, CHECKPOINT_NAME) for d, _, files in os.walk(tmp_path) if CHECKPOINT_NAME in files]
    assert len(saved) == 1 and load_checkpoint(saved[0])["epoch"] == 0  # the trained epoch is saved either way
    saved = saved[0]
    if one_line:
        assert type(caught.value) is RunFailed and caught.value.__cause__ is failure
        assert str(caught.value).startswith("evaluation after epoch 0 failed") and saved in str(caught.value)
    else:
        assert caught.value is failure  # not wrapped: run_cli prints its whole traceback
        assert f"evaluation after epoch 0 failed; the trained epoch is saved in {saved}" in capsys.readouterr().err


def test_the_run_prints_its_whole_run_estimate_after_its_first_iterations(tiny_shapes, tmp_path, capsys):
    """Four steps per epoch: the estimate comes after the first of them are timed, before the epoch's line, as
    ``estimated whole run: ~T (2 epochs x E)`` with T the two epochs of E."""
    run_training(_config(tmp_path, batch_size=2, epochs=2), tiny_shapes)
    out = capsys.readouterr().out.splitlines()
    lines = [i for i, line in enumerate(out) if line.startswith("estimated whole run: ~")]
    assert lines and lines[0] < next(i for i, line in enumerate(out) if line.startswith("epoch 0:")), out
    match = re.fullmatch(r"estimated whole run: ~([\d.]+) s \(2 epochs x ([\d.]+) s(; epoch 0 measured)?\)",
                         out[lines[0]])
    assert match and match.group(3) is None, out[lines[0]]
    assert float(match.group(1)) == pytest.approx(2 * float(match.group(2)), rel=0.1, abs=0.2)


def test_an_epoch_too_short_to_time_gets_its_estimate_after_it(tiny_shapes, tmp_path, capsys):
    run_training(_config(tmp_path, epochs=3), tiny_shapes)  # two steps an epoch
    out = capsys.readouterr().out.splitlines()
    estimates = [line for line in out if line.startswith("estimated whole run: ~")]
    assert len(estimates) == 1 and re.fullmatch(r"estimated whole run: ~[\d.]+ s \(3 epochs x [\d.]+ s; epoch 0 "
                                                r"measured\)", estimates[0]), out
    assert out.index(estimates[0]) > next(i for i, line in enumerate(out) if line.startswith("epoch 0:"))


def test_the_estimate_times_a_tenth_of_a_long_epoch():
    """A few steps are at the mercy of the loader's start: a long epoch is timed over a tenth of its steps."""
    from encoding.engine.hooks import RunEstimate

    assert [RunEstimate.measured_steps(n) for n in (2, 4, 30, 187, 1000)] == [3, 3, 3, 18, 100]
