"""encoding.engine / encoding.engine.builders and the training script, end to end on a tiny generated `shapes` dataset
(the ``tiny_shapes`` pair of conftest.py, handed to the run)."""
import csv
import math
import os

import pytest
import torch
from torch import nn

from conftest import TINY, load_script
from encoding.engine import builders
from encoding.engine import TrainingConfig, backward_step, build_training, evaluate, param_groups, train_one_epoch
from encoding.models import get_segmentation_model
from encoding.nn import SyncBatchNorm
from encoding.utils import SegmentationMetric, load_checkpoint


def load_train_script():
    return load_script("train")


def tiny_config(tmp_path, argv):
    """train.py's configuration of ``TINY + argv`` (written under ``tmp_path``)."""
    options = load_train_script().parse_args(TINY + ["--output-dir", str(tmp_path / "runs")] + argv)
    return TrainingConfig(**vars(options))


def test_param_groups_split_backbone_and_heads():
    model = get_segmentation_model("fcn", dataset="shapes", backbone="resnet18", aux=True)
    backbone, heads = param_groups(model)
    assert {id(p) for p in backbone["params"]} == {id(p) for p in model.backbone.parameters()}
    assert len(backbone["params"]) + len(heads["params"]) == len(list(model.parameters()))
    assert len(param_groups(nn.Linear(2, 2))) == 1


def test_backward_step_clips_and_steps():
    layer = nn.Linear(3, 1, bias=False)
    optimizer = torch.optim.SGD(layer.parameters(), lr=1.0)
    before = layer.weight.detach().clone()
    loss = (layer(torch.full((1, 3), 100.0)) ** 2).sum()
    backward_step(loss, optimizer, clip_grad_norm=1.0)
    assert torch.linalg.vector_norm(layer.weight.grad) == pytest.approx(1.0, rel=1e-5)
    torch.testing.assert_close(layer.weight.detach(), before - layer.weight.grad)


@pytest.mark.parametrize("clip", [-1.0, 0, 0.0, float("nan"), float("inf"), "1.0", True])
def test_backward_step_refuses_a_clip_it_cannot_use(clip):
    """A negative max norm made torch's clipping flip the gradients (training climbed); every bad value is refused
    before any gradient is touched, naming the argument."""
    layer = nn.Linear(3, 1, bias=False)
    optimizer = torch.optim.SGD(layer.parameters(), lr=1.0)
    before = layer.weight.detach().clone()
    with pytest.raises(ValueError, match=r"backward_step: clip_grad_norm must be a positive finite number"):
        backward_step(layer(torch.ones(2, 3)).sum(), optimizer, None, clip_grad_norm=clip)
    assert torch.equal(layer.weight, before) and layer.weight.grad is None
    with pytest.raises(ValueError, match=r"backward_step: loss must be a scalar tensor"):
        backward_step(layer(torch.ones(2, 3)), optimizer)


def test_train_one_epoch_rejects_nan_loss():
    model = nn.Conv2d(3, 2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = [(torch.full((2, 3, 4, 4), float("nan")), torch.zeros(2, 4, 4, dtype=torch.long))]
    with pytest.raises(FloatingPointError, match="epoch 3, iteration 0"):
        train_one_epoch(model, nn.CrossEntropyLoss(), optimizer, loader, epoch=3)


def test_train_then_evaluate_learns_a_batch():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 2, 1))
    image = torch.randn(4, 3, 8, 8)
    target = (image[:, 0] > 0).long()
    loader = [(image, target)] * 20
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    stats = train_one_epoch(model, nn.CrossEntropyLoss(), optimizer, loader, epoch=0)
    assert set(stats) == {"loss", "lr"} and math.isfinite(stats["loss"])
    result = evaluate(model, loader[:1], SegmentationMetric(2))
    assert result["pixAcc"] > 0.9


def test_train_script_runs_checkpoints_and_resumes(tiny_shapes, tmp_path):
    script = load_train_script()
    out = str(tmp_path / "runs")
    result = script.main(TINY + ["--output-dir", out], datasets=tiny_shapes)
    run_dir = os.path.join(out, "shapes", "unet", "default")
    assert 0.0 <= result["mIoU"] <= 1.0 and 0.0 <= result["pixAcc"] <= 1.0
    for name in ("checkpoint.pth", "model_best.pth", "log.csv", "log.jsonl"):
        assert os.path.isfile(os.path.join(run_dir, name)), name
    checkpoint = load_checkpoint(os.path.join(run_dir, "checkpoint.pth"), map_location="cpu")
    assert checkpoint["epoch"] == 0 and checkpoint["args"]["dataset"] == "shapes"
    script.main(TINY[:-2] + ["--epochs", "2", "--output-dir", out,
                             "--resume", os.path.join(run_dir, "checkpoint.pth")], datasets=tiny_shapes)
    with open(os.path.join(run_dir, "log.csv"), newline="") as f:
        assert [row["epoch"] for row in csv.DictReader(f)] == ["0", "1"]
    evaluated = script.main(TINY[:-2] + ["--output-dir", out, "--eval", "--resume", os.path.join(run_dir,
                                                                                              "model_best.pth")],
                            datasets=tiny_shapes)
    assert set(evaluated) >= {"pixAcc", "mIoU"}


def test_a_resumed_run_reads_its_checkpoint_file_once(tiny_shapes, tmp_path, monkeypatch):
    """Finished-check, training state, best model and log all come from one read of ``--resume``."""
    script = load_train_script()
    out = str(tmp_path / "runs")
    script.main(TINY + ["--output-dir", out], datasets=tiny_shapes)
    path = os.path.join(out, "shapes", "unet", "default", "checkpoint.pth")
    reads, real_load = [], torch.load

    def counting_load(f, *args, **kwargs):
        if isinstance(f, (str, os.PathLike)) and os.path.abspath(f) == os.path.abspath(path):
            reads.append(f)
        return real_load(f, *args, **kwargs)

    monkeypatch.setattr(torch, "load", counting_load)
    script.main(TINY[:-2] + ["--epochs", "2", "--output-dir", out, "--resume", path], datasets=tiny_shapes)
    assert len(reads) == 1
    assert load_checkpoint(path)["epoch"] == 1


def test_two_cpu_replicas_use_sync_batchnorm(tiny_shapes, tmp_path):
    run = build_training(tiny_config(tmp_path, ["--device-ids", "cpu,cpu", "--aux"]), datasets=tiny_shapes)
    assert [str(d) for d in run.model.device_ids] == ["cpu", "cpu"]
    assert any(isinstance(m, SyncBatchNorm) for m in run.model.module.modules())
    stats = train_one_epoch(run.model, run.criterion, run.optimizer, run.train_loader, scheduler=run.scheduler)
    assert math.isfinite(stats["loss"])


def test_balance_option_reaches_the_dp_wrapper(tiny_shapes, tmp_path):
    script = load_train_script()
    assert script.parse_args([]).balance == "none"
    assert script.parse_args(["--balance", "memory", "--device-ids", "cpu,cpu"]).balance == "memory"
    with pytest.raises(SystemExit):
        script.parse_args(["--balance", "fastest"])
    run = build_training(tiny_config(tmp_path, ["--device-ids", "cpu,cpu"]), datasets=tiny_shapes)
    assert run.model.balance is None


def test_builders_compose_without_an_options_namespace(tiny_shapes):
    placement = builders.select_devices(["cpu", "cpu"])
    assert placement.synced and placement.input_device is None
    loaders = builders.build_loaders("shapes", batch_size=4, workers=0, datasets=tiny_shapes)
    model = builders.build_model("fcn", "shapes", backbone="resnet18", aux=True, sync_bn=placement.synced)
    criterion = builders.build_criterion(7, aux=True)
    optimizer = builders.build_optimizer(model, 0.01)
    scheduler = builders.build_scheduler(optimizer, "poly", 0.01, 1, len(loaders.train), head_lr_mult=1.0)
    model, criterion = builders.wrap_model(model, criterion, placement)
    stats = train_one_epoch(model, criterion, optimizer, loaders.train, scheduler=scheduler)
    assert math.isfinite(stats["loss"]) and len(loaders.val.dataset) == 4
    ddp = builders.Placement([], torch.device("cpu"), torch.device("cpu"), True)
    with pytest.raises(ValueError, match="balance applies to DataParallelModel"):
        builders.wrap_model(nn.Conv2d(3, 2, 1), nn.CrossEntropyLoss(), ddp, balance="memory")


def test_each_process_keeps_a_batch_when_its_share_is_smaller_than_one(tiny_shapes, monkeypatch):
    """Under torchrun the last partial batch is dropped by each process's share, not the whole set's: 8 samples,
    2 processes, ``--batch-size 6`` train one batch of 4 on each (one of 6 in one process), not none."""
    with monkeypatch.context() as m:  # rank 0 of 2 (the sampler asks torch.distributed)
        m.setattr(torch.distributed, "get_world_size", lambda *a, **k: 2)
        m.setattr(torch.distributed, "get_rank", lambda *a, **k: 0)
        loaders = builders.build_loaders("shapes", batch_size=6, workers=0, datasets=tiny_shapes, distributed=True,
                                         validated=False)
    assert [len(batch[0]) for batch in loaders.train] == [4]
    loaders = builders.build_loaders("shapes", batch_size=6, workers=0, datasets=tiny_shapes, validated=False)
    assert [len(batch[0]) for batch in loaders.train] == [6]


def test_training_with_balance_memory_plans_from_the_runs_own_loss(shapes_root, tmp_path):
    """``train.py --device-ids cpu,cpu,cpu --balance memory``: one epoch on tiny shapes, split planned by the
    simulator from the run's criterion, every batch split over the replicas."""
    import math

    from encoding.memory import MemoryBalancer
    from encoding.engine import TrainingConfig, build_training, train_one_epoch
    from conftest import load_script, tiny_shapes_pair

    args = load_script("train").parse_args(["--crop-size", "32", "--base-size", "40", "--batch-size", "6",
                                             "--workers", "0", "--device-ids", "cpu,cpu,cpu", "--balance", "memory",
                                             "--aux", "--output-dir", str(tmp_path / "runs")])
    run = build_training(TrainingConfig(**vars(args)), datasets=tiny_shapes_pair(shapes_root, 6, 3))
    assert isinstance(run.model.balance, MemoryBalancer)
    assert run.model.balance.criterion is run.criterion.criterion
    twin = [p.detach().clone() for p in run.model.module.parameters() if p.requires_grad]
    planned = run.model.balance.optimizer(twin)  # the run's own optimizer (train.py's adamw), not SGD momentum
    assert type(planned) is type(run.optimizer) is torch.optim.AdamW
    assert [len(g["params"]) for g in planned.param_groups] == [len(g["params"]) for g in run.optimizer.param_groups]
    stats = train_one_epoch(run.model, run.criterion, run.optimizer, run.train_loader, scheduler=run.scheduler)
    assert math.isfinite(stats["loss"])
    plans = run.model.balance._plans
    assert plans, "no split was planned"
    for (batch, devices, _), plan in plans.items():
        assert sum(plan) == batch and len(plan) == devices == 3
