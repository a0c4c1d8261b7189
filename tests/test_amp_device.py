"""--amp applies where the network runs: a DataParallelModel on GPUs takes its inputs on the CPU (it scatters them),
so the training and validation loops enter CUDA's autocast from where the model's parameters are, not from the
inputs' device (which was None, and autocast was the CPU's: fp32 kernels on the GPU under an fp16 GradScaler)."""
import pytest
import torch
from torch import nn

from encoding.engine.loop import autocast_context, evaluate, train_one_epoch
from encoding.parallel import DataParallelModel
from encoding.utils.metrics import SegmentationMetric


SEEN = []


class Recorder(nn.Module):
    """A 1x1 convolution that records in ``SEEN``, in each forward (its replicas' too), whether autocast is on for
    CUDA and for the CPU."""

    def __init__(self, classes=3):
        super().__init__()
        self.conv = nn.Conv2d(3, classes, 1)

    def forward(self, x):
        SEEN.append({kind: torch.is_autocast_enabled(kind) for kind in ("cuda", "cpu")})
        return {"out": self.conv(x)}


@pytest.fixture(autouse=True)
def _fresh():
    SEEN.clear()


def _batches(n=2, device="cpu"):
    return [(torch.randn(2, 3, 8, 8, device=device), torch.randint(0, 3, (2, 8, 8), device=device))
            for _ in range(n)]


def _criterion(outputs, target):
    outputs = outputs if isinstance(outputs, list) else [outputs]
    return sum(nn.functional.cross_entropy(o["out"].float(), t.to(o["out"].device))
               for o, t in zip(outputs, target.chunk(len(outputs))))


def test_autocast_is_the_inputs_device_else_the_models():
    model = Recorder()
    with autocast_context(None, torch.bfloat16, model):  # the parameters' device: the CPU
        assert torch.is_autocast_enabled("cpu")
    with autocast_context(torch.device("cpu"), torch.bfloat16):
        assert torch.is_autocast_enabled("cpu")
    with autocast_context(None, torch.bfloat16, nn.ReLU()):  # nothing to ask: the CPU
        assert torch.is_autocast_enabled("cpu")
    with autocast_context(None, None, model):
        assert not torch.is_autocast_enabled("cpu")


def test_cpu_amp_reaches_a_data_parallel_models_replicas():
    """On the CPU (repeated devices), bf16 autocast is on inside every replica's forward, in training and in
    validation; off without --amp."""
    net = Recorder()
    model = DataParallelModel(net, device_ids=["cpu", "cpu"])
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    train_one_epoch(model, _criterion, optimizer, _batches(), device=None, amp_dtype=torch.bfloat16)
    assert SEEN and all(seen["cpu"] for seen in SEEN)
    SEEN.clear()
    evaluate(model, _batches(), SegmentationMetric(3), device=None, amp_dtype=torch.bfloat16)
    assert SEEN and all(seen["cpu"] for seen in SEEN)
    SEEN.clear()
    train_one_epoch(model, _criterion, optimizer, _batches(), device=None)
    assert SEEN and not any(seen["cpu"] for seen in SEEN)


@pytest.mark.gpu
def test_cuda_amp_reaches_a_data_parallel_models_replicas_whose_inputs_stay_on_the_cpu():
    net = Recorder().cuda()
    model = DataParallelModel(net, device_ids=[0] * 2)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cuda")
    train_one_epoch(model, _criterion, optimizer, _batches(), device=None, amp_dtype=torch.float16, scaler=scaler)
    assert SEEN and all(seen["cuda"] for seen in SEEN)
    SEEN.clear()
    evaluate(model, _batches(), SegmentationMetric(3, device=torch.device("cuda")), device=None,
             amp_dtype=torch.float16)
    assert SEEN and all(seen["cuda"] for seen in SEEN)
