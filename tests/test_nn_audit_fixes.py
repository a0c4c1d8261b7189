"""Regression tests for the encoding.nn audit: focal losses' gradients at saturation, PyTorch-Encoding's positional
signatures (SyncBatchNorm, DistSyncBatchNorm, PyramidPooling, JPU), revert_sync_batchnorm's activation,
Encoding.reset_params and convert_sync_batchnorm's process group."""
from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import encoding
from encoding.models import JPU, PyramidPooling
from encoding.nn import (BinaryFocalLoss, Encoding, FocalLoss, SyncBatchNorm, SyncBatchNormAct,
                         convert_sync_batchnorm)

DT = torch.float64


# ------------------------------------------------------------------------------------------- focal losses (bug 1)
def _naive_focal(kind: str, x: torch.Tensor, target: torch.Tensor, gamma: float) -> torch.Tensor:
    """The focal losses written plainly in float64 (``(1 - exp(log p))^gamma``), ignored pixels (-1) removed."""
    valid = target != -1
    t = torch.where(valid, target, 0)
    if kind == "softmax":
        logp_y = x.log_softmax(1).gather(1, t.unsqueeze(1)).squeeze(1)
        focal = -(1.0 - logp_y.exp()).pow(gamma) * logp_y
        return (focal * valid).sum() / valid.sum()
    if kind == "sigmoid":
        hot = F.one_hot(t, x.shape[1]).movedim(-1, 1).to(x.dtype)
        bce = F.binary_cross_entropy_with_logits(x, hot, reduction="none")
        focal = (1.0 - (-bce).exp()).pow(gamma) * bce
        return (focal * valid.unsqueeze(1)).sum() / (valid.sum() * x.shape[1])
    bce = F.binary_cross_entropy_with_logits(x[:, 0], t.to(x.dtype), reduction="none")
    focal = (1.0 - (-bce).exp()).pow(gamma) * bce
    return (focal * valid).sum() / valid.sum()


def _ours(kind: str, gamma: float):
    if kind == "binary":
        return BinaryFocalLoss(gamma=gamma)
    return FocalLoss(gamma=gamma, activation=kind)


def _inputs(kind: str, saturate: bool):
    g = torch.Generator().manual_seed(0)
    channels = 1 if kind == "binary" else 3
    x = torch.randn(2, channels, 3, 4, generator=g, dtype=DT) * 2
    target = torch.randint(-1, 2 if kind == "binary" else channels, (2, 3, 4), generator=g)
    if saturate:  # pixel (0, 0, 0): right with probability 1 in float64 (1 - p == 0 exactly)
        target[0, 0, 0] = 0 if kind != "binary" else 1
        x[0, :, 0, 0] = -800.0
        x[0, 0, 0, 0] = 800.0
    return x, target


def _losses_and_inputs(kind, gamma, saturate):
    """Our focal loss and the plain formula on copies of one input, both backpropagated: (loss, want, ours, ref)."""
    x, target = _inputs(kind, saturate=saturate)
    ours, ref = x.clone().requires_grad_(), x.clone().requires_grad_()
    loss, want = _ours(kind, gamma)(ours, target), _naive_focal(kind, ref, target, gamma)
    loss.backward()
    want.backward()
    return loss, want, ours, ref


@pytest.mark.parametrize("kind", ["softmax", "sigmoid", "binary"])
@pytest.mark.parametrize("gamma", [0.0, 0.5, 2.0])
def test_focal_equals_the_plain_formula_on_ordinary_inputs(kind, gamma):
    loss, want, ours, ref = _losses_and_inputs(kind, gamma, saturate=False)
    torch.testing.assert_close(loss, want, rtol=1e-12, atol=0)
    torch.testing.assert_close(ours.grad, ref.grad, rtol=1e-10, atol=1e-15)


@pytest.mark.parametrize("kind", ["softmax", "sigmoid", "binary"])
@pytest.mark.parametrize("gamma", [0.25, 0.5])
def test_focal_gradient_is_finite_and_zero_at_a_saturated_pixel(kind, gamma):
    """0 < gamma < 1: pow's backward at 1 - p == 0 is inf (NaN downstream); the true derivative there is 0."""
    loss, want, ours, ref = _losses_and_inputs(kind, gamma, saturate=True)
    assert not torch.isfinite(ref.grad[0, :, 0, 0]).all()  # the plain formula breaks exactly there
    assert torch.isfinite(ours.grad).all()
    assert (ours.grad[0, :, 0, 0] == 0).all()
    torch.testing.assert_close(loss, want, rtol=1e-12, atol=0)
    others = torch.ones_like(ours, dtype=torch.bool)
    others[0, :, 0, 0] = False  # each pixel's logits feed only its own term: the rest must match the plain formula
    torch.testing.assert_close(ours.grad[others], ref.grad[others], rtol=1e-10, atol=1e-15)


# -------------------------------------------------------------------------- SyncBatchNorm signatures (bug 2)
@pytest.mark.parametrize("name", ["SyncBatchNorm", "BatchNorm2d", "SynchronizedBatchNorm2d"])
@pytest.mark.parametrize("args", [(1e-5, 0.1, False), (1e-5, 0.1, True, "leaky_relu", 0.2)])
def test_a_positional_fourth_batchnorm_argument_is_refused(name, args):
    """torch's / vacancy's 4th parameter is ``affine``, PyTorch-Encoding's ``sync``: never guess."""
    cls = getattr(encoding.nn, name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        with pytest.raises(TypeError, match=r"4th positional argument.*`affine`.*`sync`"):
            cls(3, *args)


def test_pe_keyword_syncbatchnorm_applies_its_activation():
    x = torch.randn(4, 3, 5, 5, generator=torch.Generator().manual_seed(1), dtype=DT)
    bn = SyncBatchNorm(3, 1e-5, 0.1, sync=True, activation="leaky_relu", slope=0.2).double()
    assert bn.affine and bn.track_running_stats and bn.process_group is None
    mean, var = x.mean((0, 2, 3), keepdim=True), x.var((0, 2, 3), unbiased=False, keepdim=True)
    want = F.leaky_relu((x - mean) / (var + 1e-5).sqrt(), 0.2)
    torch.testing.assert_close(bn(x), want)
    plain = SyncBatchNorm(3, 1e-5, 0.1, sync=False)
    assert plain.affine and not plain.sync


def test_dist_sync_batchnorm_takes_pe_positional_process_group():
    group = object()  # a process-group handle stand-in: the layer only stores it until a distributed forward
    with pytest.warns(FutureWarning, match="DistSyncBatchNorm"):
        layer = encoding.nn.DistSyncBatchNorm(3, 1e-4, 0.2, group)
    assert layer.process_group is group and layer.affine is True and layer.track_running_stats is True
    assert (layer.eps, layer.momentum) == (1e-4, 0.2) and isinstance(layer, SyncBatchNorm)


# ------------------------------------------------------------------------- revert_sync_batchnorm (bug 3)
@pytest.mark.parametrize("make", [
    lambda: SyncBatchNorm(3, activation="leaky_relu", slope=0.1),
    lambda: SyncBatchNorm(3, activation="elu", slope=0.7, inplace=True),
    lambda: SyncBatchNormAct(3, act=nn.PReLU(3)),
    lambda: SyncBatchNormAct(3, activation="relu", drop=nn.Dropout(0.5), act=nn.Tanh()),
], ids=["leaky_relu", "elu", "act-prelu", "relu-drop-act"])
def test_revert_sync_batchnorm_keeps_the_activation(make):
    torch.manual_seed(0)
    layer = make().double().eval()
    with torch.no_grad():
        layer.running_mean.uniform_(-1, 1)
        layer.running_var.uniform_(0.5, 2)
        layer.weight.uniform_(0.5, 2)
        layer.bias.uniform_(-1, 1)
    x = torch.randn(4, 3, 5, 5, dtype=DT)
    before, keys = layer(x), list(layer.state_dict())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        plain = encoding.nn.revert_sync_batchnorm(nn.Sequential(layer))[0]
    assert not isinstance(plain, SyncBatchNorm) and not plain.training
    assert list(plain.state_dict()) == keys
    torch.testing.assert_close(plain(x), before, rtol=0, atol=0)


# ------------------------------------------------------------------- PE's up_kwargs in PSP / JPU (bug 4)
UP = {"mode": "bilinear", "align_corners": True}  # what PE's BaseNet passed


def test_pyramid_pooling_takes_pe_positional_up_kwargs():
    pool = PyramidPooling(16, nn.BatchNorm2d, UP).double().eval()
    assert [branch[0].output_size for branch in pool.branches] == [1, 2, 3, 6]
    x = torch.randn(2, 16, 12, 12, dtype=DT)
    want = torch.cat([x] + [F.interpolate(b(x), size=(12, 12), mode="bilinear", align_corners=True)
                            for b in pool.branches], 1)
    other = torch.cat([x] + [F.interpolate(b(x), size=(12, 12), mode="bilinear", align_corners=False)
                             for b in pool.branches], 1)
    out = pool(x)
    torch.testing.assert_close(out, want)
    assert not torch.allclose(out, other)  # the option matters at these sizes


def test_jpu_takes_pe_positional_up_kwargs():
    jpu = JPU([8, 16, 32], 4, nn.BatchNorm2d, UP).double().eval()
    assert len(jpu.dilations) == 4
    feats = [torch.randn(2, c, s, s, dtype=DT) for c, s in ((4, 16), (8, 8), (16, 4), (32, 2))]
    size = feats[1].shape[-2:]
    mid = torch.cat([F.interpolate(p(f), size=size, mode="bilinear", align_corners=True)
                     for p, f in zip(jpu.projections, feats[1:])], 1)
    torch.testing.assert_close(jpu(*feats)[-1], torch.cat([b(mid) for b in jpu.dilations], 1))


def test_bad_up_kwargs_are_refused_naming_them():
    with pytest.raises(ValueError, match="PyramidPooling: up_kwargs"):
        PyramidPooling(16, nn.BatchNorm2d, {"mode": "bilinear", "align": True})
    with pytest.raises(ValueError, match="JPU: up_kwargs"):
        JPU([8, 16, 32], 4, nn.BatchNorm2d, up_kwargs={"mode": "nearest", "align_corners": True})
    with pytest.raises(TypeError, match="PyramidPooling: bins is a dict .* and up_kwargs is given too"):
        PyramidPooling(16, nn.BatchNorm2d, UP, up_kwargs=UP)
    with pytest.raises(TypeError, match="JPU: dilations is a dict .* and up_kwargs is given too"):
        JPU([8, 16, 32], 4, nn.BatchNorm2d, UP, up_kwargs=UP)


# ------------------------------------------------------------------------------- Encoding.reset_params (bug 5)
@pytest.mark.parametrize("name", ["Encoding", "EncodingDrop"])
def test_encoding_reset_params_is_reset_parameters(name):
    layer = getattr(encoding.nn, name)(8, 4)
    torch.manual_seed(3)
    layer.reset_parameters()
    want = [p.detach().clone() for p in layer.parameters()]
    with torch.no_grad():
        for p in layer.parameters():
            p.zero_()
    torch.manual_seed(3)
    layer.reset_params()
    for p, w in zip(layer.parameters(), want):
        torch.testing.assert_close(p.detach(), w, rtol=0, atol=0)
    assert isinstance(layer, Encoding)


# ------------------------------------------------------------------ convert_sync_batchnorm's group (bug 6)
def test_convert_sync_batchnorm_keeps_a_torch_layers_process_group():
    group, other = object(), object()  # stand-ins for dist.new_group handles (torch's layer just stores them)
    net = nn.Sequential(nn.Conv2d(3, 4, 1), nn.SyncBatchNorm(4, process_group=group))
    assert convert_sync_batchnorm(net)[1].process_group is group
    assert SyncBatchNorm.convert_sync_batchnorm(nn.SyncBatchNorm(4, process_group=group)).process_group is group
    assert convert_sync_batchnorm(nn.SyncBatchNorm(4, process_group=group), other).process_group is other
    assert convert_sync_batchnorm(nn.BatchNorm2d(4)).process_group is None
