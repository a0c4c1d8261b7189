"""The simulator builds models whose constructor reads a tensor's value (timm's newer drop-path rates call
``torch.linspace(...).tolist()``), which fake tensors cannot answer: the gpu_proof's UPerNet-ConvNeXt-T row failed
with ``DataDependentOutputException`` on a GPU machine's timm."""
import torch
import torch.nn.functional as F
from torch import nn

from encoding.memory import DeviceProgram, Simulator
from encoding.memory.program import StepSpec
from encoding.memory.simulate import build_fake_model, new_fake_mode


class ReadsAValue(nn.Module):
    """Two convolutions whose channel count comes from a tensor's value, read in the constructor."""

    def __init__(self) -> None:
        super().__init__()
        rates = torch.linspace(0, 0.1, 4, device="cpu").tolist()  # as timm's calculate_drop_path_rates
        width = 8 * len(rates)
        self.conv1 = nn.Conv2d(3, width, 3, padding=1)
        self.conv2 = nn.Conv2d(width, 5, 1)

    def forward(self, x):
        return self.conv2(F.relu(self.conv1(x)))


def _spec(build) -> StepSpec:
    return StepSpec(build_model=build, make_inputs=lambda n: ((torch.randn(n, 3, 16, 16),), {}),
                    make_target=lambda n: torch.randint(0, 5, (n, 16, 16)),
                    criterion=lambda out, target: F.cross_entropy(out, target))


def test_a_constructor_that_reads_a_value_is_built_with_fake_tensors_of_its_shapes():
    fake_mode = new_fake_mode()
    model = build_fake_model(_spec(ReadsAValue), fake_mode)
    real = ReadsAValue()
    assert [(n, p.shape) for n, p in model.named_parameters()] == [(n, p.shape) for n, p in real.named_parameters()]
    assert all(p.device.type == "cpu" and type(p.data).__name__ == "FakeTensor" for p in model.parameters())


def test_its_simulated_peak_equals_that_of_the_same_network_built_without_reading():
    class Plain(ReadsAValue):
        def __init__(self) -> None:
            nn.Module.__init__(self)
            self.conv1 = nn.Conv2d(3, 32, 3, padding=1)
            self.conv2 = nn.Conv2d(32, 5, 1)

    program = DeviceProgram("balanced", 2, 2, source=True, replicas=1)
    reading = Simulator(_spec(ReadsAValue)).peak(program)
    plain = Simulator(_spec(Plain)).peak(program)
    assert reading == plain > 0
