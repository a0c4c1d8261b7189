"""Sliding-window inference and ``segment`` under bad inputs: a stride past the window, a zero or negative window
and an empty image are one-line refusals (test.py's before any work), and the logits are accumulated in one
full-size tensor (issue 35).
"""
import numpy as np
import pytest
import torch


class _Logits(torch.nn.Module):
    """A stand-in network: 5 classes of logits at its input's size."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 5, 1)

    def forward(self, x):
        return self.conv(x)


@pytest.mark.parametrize("window, stride", [(20, 50), (16, 40), ((16, 16), (8, 40))])
def test_slide_refuses_a_stride_larger_than_the_window(window, stride):
    from encoding import segment
    from encoding.models import SlidingWindow

    image = torch.randint(0, 255, (3, 90, 100), dtype=torch.uint8)
    with pytest.raises(ValueError, match="larger than the window"):
        SlidingWindow(_Logits().eval(), window, stride)
    if isinstance(window, int):
        with pytest.raises(ValueError, match=f"stride {stride} is larger than the window {window}"):
            segment(_Logits().eval(), image, mode="slide", window=window, stride=stride)


@pytest.mark.parametrize("window, stride", [(0, None), (16, 0), (-4, None), (16.5, None)])
def test_slide_refuses_a_zero_or_negative_window(window, stride):
    from encoding import segment

    image = torch.randint(0, 255, (3, 40, 40), dtype=torch.uint8)
    with pytest.raises(ValueError, match="must be a positive number of pixels"):
        segment(_Logits().eval(), image, mode="slide", window=window, stride=stride)


@pytest.mark.parametrize("shape", [(0, 0, 3), (0, 12, 3), (12, 0, 3)])
def test_segment_refuses_an_empty_image_in_one_line(shape):
    from encoding import segment

    with pytest.raises(ValueError, match="empty") as err:
        segment(_Logits().eval(), np.zeros(shape, np.uint8))
    assert "\n" not in str(err.value)


def test_test_py_refuses_stride_past_window_before_any_work(capsys):
    from encoding.inference.evaluation import EvaluationConfig, build_evaluation
    from encoding.inference.predict import InferenceOptionError

    config = EvaluationConfig(resume="/nonexistent/model_best.pth", inference="slide", window=16, stride=40,
                              mode="testval")
    with pytest.raises(InferenceOptionError, match="stride 40 is larger than the window 16") as err:
        build_evaluation(config)  # before the (missing) checkpoint is even looked at
    assert err.value.exit_status == 2


def test_slide_holds_one_full_size_copy_of_the_logits():
    """The logits are accumulated and averaged in place: one tensor of the result's size is ever allocated."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from encoding.models import MultiEvalModule, SlidingWindow

    class FullSize(TorchDispatchMode):
        def __init__(self, numel):
            super().__init__()
            self.numel, self.allocated = numel, []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            inplace = func._schema.name.endswith("_") or any(a.is_out for a in func._schema.arguments)
            for t in (out if isinstance(out, (tuple, list)) else [out]):
                if isinstance(t, torch.Tensor) and not inplace and t.numel() >= self.numel and \
                        func not in (torch.ops.aten.slice.Tensor, torch.ops.aten.view.default,
                                     torch.ops.aten.alias.default, torch.ops.aten.detach.default):
                    self.allocated.append(str(func))
            return out

    image = torch.randn(1, 3, 61, 77)
    model = _Logits().eval()
    whole = model(image)
    for module in (SlidingWindow(model, 24, 16), MultiEvalModule(model, 5, base_size=77, crop_size=24, scales=(1.0,),
                                                                 flip=False)):
        with FullSize(whole.numel()) as mode:
            out = module(image)
        assert len(mode.allocated) == 1, mode.allocated
        torch.testing.assert_close(out, whole, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("crop", [64, 32])  # one padded pass; sliding windows
def test_multieval_refuses_an_nclass_that_is_not_the_network_s_channels(crop):
    """A binary network's one channel with nclass=2 was broadcast into two equal channels on the sliding path (every
    pixel background), and passed on the single pass: both paths refuse it, and nclass=1 scores it."""
    from encoding.models import MultiEvalModule

    class OneChannel(torch.nn.Module):
        def forward(self, x):
            return x[:, :1] * 10

    image = torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match=r"MultiEvalModule\(nclass=2\): the network returns logits of shape "
                                         r"\(1, 1, \d+, \d+\); nclass must be its number of output channels"):
        MultiEvalModule(OneChannel(), nclass=2, base_size=64, crop_size=crop, scales=(1.0,), flip=False)(image)
    out = MultiEvalModule(OneChannel(), nclass=1, base_size=64, crop_size=crop, scales=(1.0,), flip=False)(image)
    assert torch.equal(out > 0, image[:, :1] > 0)


def test_segment_refuses_scales_with_mode_slide():
    """segment(mode="slide", scales=...) ran MultiEvalModule's padded windows, not mode="slide"'s (other logits), as
    if mode were "whole"; test.py refuses --mode slide with --multi-scale. Both spellings are one refusal now."""
    from encoding import segment
    from encoding.inference.predict import InferenceOptionError

    image = np.zeros((40, 40, 3), np.uint8)
    with pytest.raises(InferenceOptionError, match=r"mode='slide' is single-scale .* drop mode='slide' or scales"):
        segment(_Logits().eval(), image, mode="slide", scales=[1.0], window=32)
