"""SmoothedValue / MetricLogger / AverageMeter / EpochLogger."""
import csv
import importlib.util
import json
import math
import warnings

import numpy as np
import pytest
import torch

from encoding.utils import AverageMeter, EpochLogger, MetricLogger, SmoothedValue


def test_smoothed_value_window_and_global():
    meter = SmoothedValue(window_size=3)
    assert math.isnan(meter.median) and math.isnan(meter.global_avg)
    for value, n in [(1.0, 1), (5.0, 2), (2.0, 1), (10.0, 4)]:
        meter.update(value, n)
    assert list(meter.deque) == [5.0, 2.0, 10.0]
    assert meter.median == 5.0 and meter.avg == pytest.approx(17 / 3) and meter.max == 10.0 and meter.value == 10.0
    assert meter.global_avg == pytest.approx((1 + 10 + 2 + 40) / 8)
    meter.update(torch.tensor(4.0))
    assert meter.value == 4.0 and meter.median == 4.0  # window [2, 10, 4]
    even = SmoothedValue(window_size=4)
    for v in (1, 2, 3, 10):
        even.update(v)
    assert even.median == 2.5
    with pytest.raises(ValueError, match="scalar"):
        meter.update(torch.ones(2))


def test_metric_logger_postfix():
    logger = MetricLogger(window_size=2)
    logger.update(loss=torch.tensor(0.5), lr=0.01)
    logger.update(loss=0.25, lr=0.02, n=3)
    logger.add_meter("time", SmoothedValue(fmt="{value:.1f}s"))
    logger.update(time=1.25)
    assert logger.postfix() == {"loss": "0.3750", "lr": "0.0150", "time": "1.2s"}
    assert logger.postfix(["lr", "missing"]) == {"lr": "0.0150"}
    averages = logger.global_averages()
    assert averages["loss"] == pytest.approx((0.5 + 3 * 0.25) / 4) and "lr" in logger
    assert "loss: 0.3750" in str(logger)
    logger.synchronize_between_processes()  # no-op without torch.distributed
    assert logger.global_averages() == averages


def test_average_meter():
    meter = AverageMeter()
    meter.update(2.0)
    meter.update(4.0, n=3)
    assert meter.val == 4.0 and meter.sum == 14.0 and meter.count == 4 and meter.avg == 3.5
    meter.reset()
    assert meter.count == 0 and meter.avg == 0.0


def test_epoch_logger_csv_jsonl(tmp_path):
    with EpochLogger(tmp_path / "run", enabled=True) as log:
        row = log.write(0, loss=torch.tensor(0.5), mIoU=np.float64(0.25), IoU=torch.tensor([0.5, float("nan")]))
        log.write(1, loss=0.4, mIoU=float("nan"))
        log.write(2, loss=0.3, mIoU=0.5, pixAcc=0.9)  # new column: header extended
    assert row == {"epoch": 0, "loss": 0.5, "mIoU": 0.25, "IoU": [0.5, None]}
    lines = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in lines] == [0, 1, 2] and lines[1]["mIoU"] is None and lines[2]["pixAcc"] == 0.9
    with open(tmp_path / "run" / "log.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == ["epoch", "loss", "mIoU", "IoU", "pixAcc"]
    assert rows[0]["IoU"] == "[0.5, null]" and rows[0]["pixAcc"] == ""
    assert rows[1]["mIoU"] == "" and rows[2] == {"epoch": "2", "loss": "0.3", "mIoU": "0.5", "IoU": "",
                                                 "pixAcc": "0.9"}
    EpochLogger(tmp_path / "run", enabled=True).write(3, loss=0.2)  # resume appends
    with open(tmp_path / "run" / "log.csv", newline="") as f:
        assert [r["epoch"] for r in csv.DictReader(f)] == ["0", "1", "2", "3"]


def test_epoch_logger_disabled_writes_nothing(tmp_path):
    log = EpochLogger(tmp_path / "quiet", enabled=False)
    assert log.write(0, loss=1.0) == {"epoch": 0, "loss": 1.0}
    assert not (tmp_path / "quiet").exists()


def test_tensorboard_is_optional(tmp_path):
    installed = importlib.util.find_spec("tensorboard") is not None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        log = EpochLogger(tmp_path / "tb", tensorboard=True, enabled=True)
    log.write(0, loss=1.0)
    log.close()
    assert (tmp_path / "tb" / "log.csv").exists()
    events = list((tmp_path / "tb").glob("events.out.tfevents*"))
    if installed:
        assert events and not caught
    else:
        assert not events and any("tensorboard is not installed" in str(w.message) for w in caught)
