"""Tests of the Encoding layer (encoding.nn) and of the model heads (encoding.models.<arch>), CPU, float64 references."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torchvision.models.segmentation.deeplabv3 import ASPP as TorchvisionASPP
from torchvision.models.segmentation.deeplabv3 import DeepLabHead
from torchvision.models.segmentation.fcn import FCNHead as TorchvisionFCNHead

import encoding.nn
from conftest import same_or_declared_alias
from encoding.models import (ASPP, CAM, DANetHead, DeepLabV3Head, EncHead, EncModule, FCNHead, FPNHead, JPU, PAM,
                             PSPHead, PyramidPooling)
from encoding.nn import Encoding

DOUBLE = torch.float64


def naive_encoding(x, codewords, scale):
    """Deep-TEN aggregation written directly from the definition, materializing every residual x_i - c_k."""
    x = x.flatten(2).transpose(1, 2)  # B x N x D
    residuals = x.unsqueeze(2) - codewords  # B x N x K x D
    weights = torch.softmax(scale * residuals.pow(2).sum(-1), dim=2)  # B x N x K
    return (weights.unsqueeze(-1) * residuals).sum(1)


# ----------------------------------------------------------------------------------------------------- Encoding
@pytest.mark.parametrize("shape", [(2, 6, 4, 5), (3, 6, 7)])
def test_encoding_matches_definition(shape):
    torch.manual_seed(0)
    layer = Encoding(D=6, K=4).to(DOUBLE)
    with torch.no_grad():  # spread codewords and scales so that the assignment is far from uniform
        layer.codewords.normal_()
        layer.scale.uniform_(-2, -0.5)
    x = torch.randn(*shape, dtype=DOUBLE)
    out = layer(x)
    assert out.shape == (shape[0], 4, 6)
    torch.testing.assert_close(out, naive_encoding(x, layer.codewords, layer.scale), rtol=1e-10, atol=1e-10)


def test_encoding_gradcheck():
    torch.manual_seed(1)
    layer = Encoding(D=3, K=4).to(DOUBLE)
    x = torch.randn(2, 3, 2, 3, dtype=DOUBLE, requires_grad=True)
    codewords = layer.codewords.detach().clone().requires_grad_()
    scale = layer.scale.detach().clone().requires_grad_()

    def encode(x, codewords, scale):
        return torch.func.functional_call(layer, {"codewords": codewords, "scale": scale}, (x,))

    assert torch.autograd.gradcheck(encode, (x, codewords, scale))


def test_encoding_never_materializes_all_residuals():
    """Neither the forward's saved tensors nor anything kept for backward has B*N*K*D elements."""
    B, D, K, H, W = 2, 8, 8, 4, 4
    layer = Encoding(D, K)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel()) or t, lambda t: t):
        layer(torch.randn(B, D, H, W, requires_grad=True)).sum().backward()
    assert saved and max(saved) < B * H * W * K * D


def test_encoding_init_and_errors():
    layer = Encoding(D=50, K=8)
    bound = 1 / (50 * 8) ** 0.5
    assert layer.codewords.abs().max() <= bound and layer.codewords.std() > bound / 4
    assert ((layer.scale >= -1) & (layer.scale <= 0)).all()
    with pytest.raises(ValueError, match=r"Encoding\(D=50\).*\(2, 49, 3, 3\)"):
        layer(torch.randn(2, 49, 3, 3))
    with pytest.raises(ValueError, match="positive"):
        Encoding(D=0, K=3)


# ---------------------------------------------------------------------------------------------------- EncModule
def test_encmodule_is_channel_attention():
    torch.manual_seed(0)
    module = EncModule(16, nclass=5, ncodes=4, se_loss=True).to(DOUBLE).eval()
    with torch.no_grad():
        module.codeword_norm.running_mean.normal_()
        module.codeword_norm.running_var.uniform_(0.5, 2)
    x = torch.randn(2, 16, 6, 6, dtype=DOUBLE)
    out, se = module(x)
    encoded = module.encoding(x)  # B x K x C
    norm = module.codeword_norm
    encoded = (encoded - norm.running_mean[:, None]) / torch.sqrt(norm.running_var[:, None] + norm.eps)
    encoded = F.relu(encoded * norm.weight[:, None] + norm.bias[:, None]).mean(1)
    gamma = torch.sigmoid(module.fc[0](encoded))
    torch.testing.assert_close(out, F.relu(x + x * gamma[:, :, None, None]))
    torch.testing.assert_close(se, module.selayer(encoded))
    assert se.shape == (2, 5)
    plain = EncModule(16, nclass=5, ncodes=4, se_loss=False)
    out = plain(torch.randn(2, 16, 3, 3))  # always a tuple, as PyTorch-Encoding's: (features,)
    assert plain.selayer is None and isinstance(out, tuple) and len(out) == 1 and out[0].shape == (2, 16, 3, 3)


@pytest.mark.parametrize("lateral", [False, True])
def test_enchead_outputs_and_lateral_fusion(lateral):
    torch.manual_seed(0)
    head = EncHead(32, 5, se_loss=True, lateral=lateral, lateral_channels=(8, 16), width=16, ncodes=4)
    c2, c3, c4 = torch.randn(2, 8, 8, 8), torch.randn(2, 16, 4, 4), torch.randn(2, 32, 4, 4)
    out, se = head(c2, c3, c4)
    assert out.shape == (2, 5, 4, 4) and se.shape == (2, 5)
    (out.sum() + se.sum()).backward()
    assert all(p.grad is not None for p in head.parameters())
    if lateral:
        with pytest.raises(ValueError, match="3 feature maps"):
            head(c4)


# ---------------------------------------------------------------------------------- torchvision-compatible heads
@pytest.mark.parametrize("ours, theirs", [
    (lambda: FCNHead(32, 5), lambda: TorchvisionFCNHead(32, 5)),
    (lambda: ASPP(32, (1, 2, 3), 16), lambda: TorchvisionASPP(32, (1, 2, 3), 16)),
    (lambda: DeepLabV3Head(32, 5, (1, 2, 3)), lambda: DeepLabHead(32, 5, (1, 2, 3))),
], ids=["FCNHead", "ASPP", "DeepLabV3Head"])
def test_heads_share_torchvision_layout(ours, theirs):
    torch.manual_seed(0)
    reference = theirs().to(DOUBLE)
    for m in reference.modules():  # non-trivial running statistics
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.normal_()
            m.running_var.uniform_(0.5, 2)
    module = ours().to(DOUBLE)
    module.load_state_dict(reference.state_dict())  # strict: identical keys and shapes
    x = torch.randn(2, 32, 9, 9, dtype=DOUBLE)
    torch.testing.assert_close(module.eval()(x), reference.eval()(x), rtol=0, atol=0)


# ------------------------------------------------------------------------------------------------- other blocks
def test_pyramid_pooling_keeps_input_and_pools_bins():
    torch.manual_seed(0)
    pool = PyramidPooling(16).eval()
    x = torch.randn(2, 16, 12, 12)
    out = pool(x)
    assert out.shape == (2, 32, 12, 12) and pool.out_channels == 32
    torch.testing.assert_close(out[:, :16], x, rtol=0, atol=0)
    # the 1x1 bin is constant over space; the 2x2 bin is constant on the 6x6 quadrants away from the borders
    assert torch.allclose(out[:, 16:20], out[:, 16:20, :1, :1].expand(-1, -1, 12, 12))
    assert not torch.allclose(out[:, 20:24, :3, :3].mean((-1, -2)), out[:, 20:24, -3:, -3:].mean((-1, -2)))


def test_psphead_shape():
    assert PSPHead(32, 5)(torch.randn(2, 32, 8, 8)).shape == (2, 5, 8, 8)


def _naive_pam(module, x):
    b, c, h, w = x.shape
    q = module.query_conv(x).view(b, -1, h * w).permute(0, 2, 1)
    k = module.key_conv(x).view(b, -1, h * w)
    attention = torch.softmax(torch.bmm(q, k), dim=-1)  # B x N x N
    v = module.value_conv(x).view(b, c, h * w)
    return module.gamma * torch.bmm(v, attention.permute(0, 2, 1)).view(b, c, h, w) + x


def _naive_cam(module, x):
    b, c, h, w = x.shape
    q = x.view(b, c, -1)
    energy = torch.bmm(q, q.permute(0, 2, 1))
    attention = torch.softmax(energy.max(-1, keepdim=True)[0].expand_as(energy) - energy, dim=-1)
    return module.gamma * torch.bmm(attention, q).view(b, c, h, w) + x


@pytest.mark.parametrize("make, naive", [(lambda: PAM(16), _naive_pam), (lambda: CAM(), _naive_cam)],
                         ids=["PAM", "CAM"])
def test_attention_modules_match_definition(make, naive):
    torch.manual_seed(0)
    module = make().to(DOUBLE)
    x = torch.randn(2, 16, 5, 6, dtype=DOUBLE)
    torch.testing.assert_close(module(x), x, rtol=0, atol=0)  # gamma starts at 0: identity
    with torch.no_grad():
        module.gamma.fill_(0.7)
    torch.testing.assert_close(module(x), naive(module, x), rtol=1e-10, atol=1e-10)


def test_danet_head_trains_every_parameter():
    torch.manual_seed(0)
    head = DANetHead(32, 5)
    out = head(torch.randn(2, 32, 6, 6))
    assert out.shape == (2, 5, 6, 6)
    out.square().sum().backward()
    assert all(p.grad is not None for p in head.parameters())


def test_jpu_upsamples_last_three_stages():
    torch.manual_seed(0)
    jpu = JPU((8, 16, 32), width=4)
    c1, c2, c3, c4 = (torch.randn(2, 4, 16, 16), torch.randn(2, 8, 8, 8), torch.randn(2, 16, 4, 4),
                      torch.randn(2, 32, 2, 2))
    out = jpu(c1, c2, c3, c4)
    assert len(out) == 4 and all(a is b for a, b in zip(out[:3], (c1, c2, c3)))
    assert out[3].shape == (2, 16, 8, 8) and jpu.out_channels == 16
    out[3].sum().backward()
    assert all(p.grad is not None for p in jpu.parameters())
    with pytest.raises(ValueError, match="at least 3"):
        jpu(c4)


@pytest.mark.parametrize("pyramid_pooling", [False, True])
def test_fpn_head(pyramid_pooling):
    head = FPNHead((4, 8, 16, 32), 5, fpn_dim=8, pyramid_pooling=pyramid_pooling)
    feats = [torch.randn(2, c, s, s) for c, s in zip((4, 8, 16, 32), (16, 8, 4, 2))]
    out = head(*feats)
    assert out.shape == (2, 5, 16, 16)
    out.sum().backward()
    assert all(p.grad is not None for p in head.parameters())
    with pytest.raises(ValueError, match="4 feature maps"):
        head(*feats[1:])


class MarkedNorm(nn.BatchNorm2d):
    """A norm layer class that can be told apart from the default."""


@pytest.mark.parametrize("build", [
    lambda n: FCNHead(32, 5, n), lambda n: PSPHead(32, 5, n), lambda n: DeepLabV3Head(32, 5, norm_layer=n),
    lambda n: EncHead(32, 5, lateral=True, lateral_channels=(8, 16), width=16, norm_layer=n),
    lambda n: DANetHead(32, 5, n), lambda n: JPU((8, 16, 32), 4, n),
    lambda n: FPNHead((4, 8, 16, 32), 5, n, pyramid_pooling=True),
], ids=["FCNHead", "PSPHead", "DeepLabV3Head", "EncHead", "DANetHead", "JPU", "FPNHead"])
def test_norm_layer_is_used_everywhere(build):
    norms = [m for m in build(MarkedNorm).modules() if isinstance(m, nn.modules.batchnorm._NormBase)]
    assert norms and all(type(m) is MarkedNorm for m in norms)


def test_pytorch_encoding_head_names_still_import_from_encoding_nn():
    from encoding.nn import FCNHead as nn_fcn_head, JPU as nn_jpu  # noqa: N813 - PE import path

    assert same_or_declared_alias(nn_fcn_head, FCNHead) and same_or_declared_alias(nn_jpu, JPU)
    for head in (ASPP, CAM, DANetHead, DeepLabV3Head, EncHead, EncModule, FPNHead, PAM, PSPHead, PyramidPooling):
        assert same_or_declared_alias(getattr(encoding.nn, head.__name__), head), head
    with pytest.raises(AttributeError, match="no attribute 'NotAHead'"):
        encoding.nn.NotAHead
