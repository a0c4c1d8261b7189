"""PyTorch-Encoding's ``BaseNet``: a PE user's own network, subclassed as PE's docs and models did, builds on our
backbones, trains through ``DataParallelModel`` + ``DataParallelCriterion(SegmentationLosses)`` exactly as the plain
network does (float64, three CPU replicas, uneven split), and evaluates with PE's counts.
"""
import copy
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import encoding
from encoding import legacy
from encoding.models.backbone import get_backbone
from encoding.nn import SegmentationLosses
from encoding.parallel import DataParallelCriterion, DataParallelModel
from equivalence import assert_same_sgd_step

BaseNet = encoding.models.BaseNet
FCNHead = encoding.models.FCNHead  # PE's encoding.nn.FCNHead (an old name that warns)


class PENet(BaseNet):
    """A network as PE users wrote them (PE's FCN, shortened): tuple outputs ``(out[, aux])``."""

    def __init__(self, nclass, backbone, aux=True, se_loss=False, norm_layer=nn.BatchNorm2d, **kwargs):
        super(PENet, self).__init__(nclass, backbone, aux, se_loss, norm_layer=norm_layer, **kwargs)
        c3, c4 = self.pretrained.channels[2:]  # PE's networks wrote 1024, 2048 (ResNet-50)
        self.head = FCNHead(c4, nclass, norm_layer)
        if aux:
            self.auxlayer = FCNHead(c3, nclass, norm_layer)

    def forward(self, x):
        imsize = x.size()[2:]
        _, _, c3, c4 = self.base_forward(x)
        outputs = [F.interpolate(self.head(c4), imsize, **self._up_kwargs)]
        if self.aux:
            outputs.append(F.interpolate(self.auxlayer(c3), imsize, **self._up_kwargs))
        return tuple(outputs)


def _net(backbone="resnet18", **options):
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*BaseNet")  # a subclass is the supported use: no warning
        return PENet(4, backbone, **options)


def test_basenet_is_bound_where_pe_exported_it_and_warns_only_when_built_itself():
    assert encoding.models.base.BaseNet is BaseNet is legacy.ALIASES["encoding.models"]["BaseNet"]
    with pytest.warns(FutureWarning, match="encoding.models.SegmentationModel"):
        BaseNet(3, "vgg_tiny", False, False)
    _net()


def test_pe_attributes_and_state_dict_keys():
    net = _net(base_size=100, crop_size=80)
    assert (net.nclass, net.aux, net.se_loss, net.backbone, net.base_size, net.crop_size) == (
        4, True, False, "resnet18", 100, 80)
    assert net.mean == [.485, .456, .406] and net.std == [.229, .224, .225]
    assert net._up_kwargs == {"mode": "bilinear", "align_corners": True}  # PE's up_kwargs
    keys = list(net.state_dict())
    assert "pretrained.layer4.1.conv2.weight" in keys and "pretrained.conv1.weight" in keys
    assert not any(k.startswith("pretrained.fc") for k in keys)


@pytest.mark.parametrize("dilated,strides", [(True, (4, 8, 8, 8)), (False, (4, 8, 16, 32))])
def test_base_forward_is_our_backbone_at_pe_strides(dilated, strides):
    net = _net(dilated=dilated).double().eval()
    reference = get_backbone("resnet18", 8 if dilated else 32).double().eval()
    reference.load_state_dict(net.pretrained.state_dict())
    x = torch.randn(2, 3, 64, 64, dtype=torch.float64)
    ours, theirs = net.base_forward(x), reference(x)
    assert tuple(64 // c.shape[-1] for c in ours) == strides
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_evaluate_gives_the_output_or_pe_counts():
    net = _net().eval()
    x = torch.randn(2, 3, 48, 48)
    target = torch.randint(-1, 4, (2, 48, 48), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        out = net(x)[0]
        assert torch.equal(net.evaluate(x), out)
        correct, labeled, inter, union = net.evaluate(x, target)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        assert (correct, labeled) == encoding.utils.batch_pix_accuracy(out, target)
        pe_inter, pe_union = encoding.utils.batch_intersection_union(out, target, 4)
    assert inter.tolist() == pe_inter.tolist() and union.tolist() == pe_union.tolist()


def test_a_pe_network_trains_through_the_parallel_wrappers_exactly():
    """Three CPU replicas, 5 samples split 2/2/1, SyncBatchNorm as PE's multi-GPU recipe: loss and every gradient
    equal the plain network's (float64)."""
    plain = _net("vgg_tiny", norm_layer=encoding.nn.SyncBatchNorm).double().train()
    for module in plain.modules():  # dropout draws per replica: the exact comparison is of everything else
        if isinstance(module, nn.modules.dropout._DropoutNd):
            module.p = 0.0
    parallel = copy.deepcopy(plain)
    model = DataParallelModel(parallel, device_ids=["cpu", "cpu", "cpu"])
    criterion = DataParallelCriterion(SegmentationLosses(aux=True, aux_weight=0.4, nclass=4),
                                      device_ids=["cpu", "cpu", "cpu"])
    plain_criterion = SegmentationLosses(aux=True, aux_weight=0.4, nclass=4)
    x = torch.randn(5, 3, 32, 32, dtype=torch.float64)
    target = torch.randint(-1, 4, (5, 32, 32), generator=torch.Generator().manual_seed(2))
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (plain, parallel)]

    def close(a, b):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-9)

    assert_same_sgd_step(plain, parallel, x, lambda v: plain_criterion(*plain(v), target),
                         lambda v: criterion(model(v), target), optimizers, close)


def test_options_pe_passed_on_to_its_backbone_factory_are_refused_not_ignored():
    with pytest.raises(TypeError, match="jpu"):
        _net(jpu="JPU")
    with pytest.raises(ValueError, match="root='/data/models'"):
        _net(root="/data/models")
    with pytest.raises(ValueError, match="unknown backbone 'resnet5'"):
        PENet(4, "resnet5")
