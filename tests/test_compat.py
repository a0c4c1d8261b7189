"""The names users of PyTorch-Encoding, Synchronized-BatchNorm (vacancy) and mmcv import, on CPU replicas.

Each test states the behaviour the peer's users rely on; equivalences are checked in float64 against the plain
single-device computation.
"""
import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import encoding
from encoding import functions
from encoding.nn import (BatchNorm1d, BatchNorm2d, BatchNorm3d, ConcurrentModule, DropBlock2D, Encoding, EncodingDrop,
                         GlobalAvgPool2d, GramMatrix, LabelSmoothing, Mean, Normalize, Sum, SyncBatchNorm,
                         SynchronizedBatchNorm1d, SynchronizedBatchNorm2d, SynchronizedBatchNorm3d, View,
                         convert_model, patch_sync_batchnorm, revert_sync_batchnorm)
from encoding.parallel import (DataParallelCriterion, DataParallelModel, DataParallelWithCallback, is_module_wrapper)

TOL = dict(rtol=0, atol=1e-6)
CPU2 = ["cpu", "cpu"]


def close(got, want):
    torch.testing.assert_close(got, want, **TOL)


# ----------------------------------------------------------------------------------- encoding.functions


def _codes(B=2, N=6, K=3, D=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(B, N, D, generator=g, dtype=torch.float64),
            torch.randn(K, D, generator=g, dtype=torch.float64),
            torch.rand(K, generator=g, dtype=torch.float64) - 1)


def test_scaled_l2_and_aggregate_follow_their_definitions():
    X, C, S = _codes()
    expected_sl = S * ((X.unsqueeze(2) - C) ** 2).sum(-1)  # B x N x K, the definition
    close(functions.scaled_l2(X, C, S), expected_sl)
    A = torch.softmax(expected_sl, dim=2)
    expected_e = (A.unsqueeze(-1) * (X.unsqueeze(2) - C)).sum(1)  # B x K x D
    close(functions.aggregate(A, X, C), expected_e)
    inputs = tuple(t.clone().requires_grad_() for t in (A, X, C))
    assert torch.autograd.gradcheck(functions.aggregate, inputs)
    assert torch.autograd.gradcheck(functions.scaled_l2, tuple(t.clone().requires_grad_() for t in (X, C, S)))


def test_functions_compose_to_the_encoding_layer():
    layer = Encoding(D=4, K=3).double()
    x = torch.randn(2, 4, 3, 2, dtype=torch.float64)
    X = x.flatten(2).transpose(1, 2)
    A = torch.softmax(functions.scaled_l2(X, layer.codewords, layer.scale), dim=2)
    close(functions.aggregate(A, X, layer.codewords), layer(x))


def test_pairwise_cosine():
    X, C, _ = _codes()
    close(functions.pairwise_cosine(X, C), X @ C.t())
    close(functions.pairwise_cosine(X, C, normalize=True), F.cosine_similarity(X.unsqueeze(2), C, dim=-1))


def test_sum_square_and_moments_per_channel():
    x = torch.randn(5, 3, 4, 2, dtype=torch.float64)
    total, squares = functions.sum_square(x)
    close(total, x.sum((0, 2, 3)))
    close(squares, (x ** 2).sum((0, 2, 3)))
    mean, mean_square = functions.moments(x)
    close(mean, x.mean((0, 2, 3)))
    close(mean_square, (x ** 2).mean((0, 2, 3)))


@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("name", ["syncbatchnorm", "inp_syncbatchnorm"])
def test_syncbatchnorm_functional_is_batchnorm_plus_activation_on_one_process(training, name):
    x = torch.randn(6, 3, 4, dtype=torch.float64)
    gamma, beta = torch.rand(3, dtype=torch.float64) + 0.5, torch.randn(3, dtype=torch.float64)
    mean, var = torch.randn(3, dtype=torch.float64), torch.rand(3, dtype=torch.float64) + 0.5
    ref_mean, ref_var = mean.clone(), var.clone()
    out = getattr(functions, name)(x, gamma, beta, mean, var, None, True, training, 0.1, 1e-5, "leaky_relu", 0.02)
    close(out, F.leaky_relu(F.batch_norm(x, ref_mean, ref_var, gamma, beta, training, 0.1, 1e-5), 0.02))
    close(mean, ref_mean)  # running statistics updated in place, as nn.BatchNorm does
    close(var, ref_var)


# ----------------------------------------------------------------------------------- SyncBatchNorm keywords


def _replicated(module, x, devices=CPU2):
    return torch.cat(list(DataParallelModel(module, devices)(x)))


def test_pytorch_encoding_syncbatchnorm_keywords():
    x = torch.randn(7, 10, 3, dtype=torch.float64)
    layer = SyncBatchNorm(10, inplace=True, sync=True).double()  # PyTorch-Encoding's own unit test call
    close(_replicated(layer, x), F.batch_norm(x, None, None, training=True))
    leaky = SyncBatchNorm(10, activation="leaky_relu", slope=0.05).double()
    close(_replicated(leaky, x), F.leaky_relu(F.batch_norm(x, None, None, training=True), 0.05))
    with pytest.raises(ValueError, match="activation"):
        SyncBatchNorm(10, activation="swish")


def test_sync_false_normalises_each_replica_alone():
    x = torch.randn(6, 4, dtype=torch.float64)
    layer = SyncBatchNorm(4, sync=False).double()
    outputs = DataParallelModel(layer, CPU2)(x)
    close(torch.cat(list(outputs)), torch.cat([F.batch_norm(x[:3], None, None, training=True),
                                               F.batch_norm(x[3:], None, None, training=True)]))


def test_activation_backward_matches_plain_batchnorm_then_activation():
    torch.manual_seed(1)
    x = torch.randn(7, 3, 4, 4, dtype=torch.float64)
    plain = nn.Sequential(nn.BatchNorm2d(3), nn.LeakyReLU(0.1)).double()
    sync = SyncBatchNorm(3, activation="leaky_relu", slope=0.1, inplace=True).double()
    x_plain, x_sync = x.clone().requires_grad_(), x.clone().requires_grad_()
    plain(x_plain).pow(2).sum().backward()
    _replicated(sync, x_sync, ["cpu"] * 3).pow(2).sum().backward()
    close(x_sync.grad, x_plain.grad)
    close(sync.weight.grad, plain[0].weight.grad)
    close(sync.bias.grad, plain[0].bias.grad)


# ----------------------------------------------------------------------------------- dimension-checked names


@pytest.mark.parametrize("cls, torch_cls, shape", [
    (BatchNorm1d, nn.BatchNorm1d, (6, 3, 5)), (BatchNorm2d, nn.BatchNorm2d, (6, 3, 4, 4)),
    (BatchNorm3d, nn.BatchNorm3d, (6, 3, 2, 2, 2)), (SynchronizedBatchNorm2d, nn.BatchNorm2d, (6, 3, 4, 4))])
def test_old_batchnorm_names_are_synchronised_and_check_their_dims(cls, torch_cls, shape):
    x = torch.randn(*shape, dtype=torch.float64)
    layer = cls(3).double()
    assert isinstance(layer, SyncBatchNorm)
    plain = torch_cls(3).double()
    close(_replicated(layer, x, ["cpu"] * 3), plain(x))
    close(layer.running_var, plain.running_var)
    with pytest.raises(ValueError, match="expected"):
        layer(torch.randn(4, 3, *([2] * (len(shape) - 1)), dtype=torch.float64))


def test_vacancy_names_are_the_same_classes():
    assert SynchronizedBatchNorm1d is BatchNorm1d and SynchronizedBatchNorm3d is BatchNorm3d
    assert SynchronizedBatchNorm2d is BatchNorm2d


# ----------------------------------------------------------------------------------- conversions


def _bn_net():
    return nn.Sequential(nn.Conv2d(3, 4, 1), nn.BatchNorm2d(4, momentum=0.3), nn.Flatten(2), nn.BatchNorm1d(4),
                         nn.Unflatten(2, (3, 3)), nn.Unflatten(2, (1, 3)), nn.BatchNorm3d(4, eps=1e-3)).double()


def test_convert_model_keeps_dims_and_wraps_data_parallel():
    net = _bn_net()
    weight = net[1].weight
    dp = nn.DataParallel(net, device_ids=[])
    converted = convert_model(dp)
    assert isinstance(converted, DataParallelWithCallback)
    inner = converted.module
    assert [type(inner[i]) for i in (1, 3, 6)] == [SynchronizedBatchNorm2d, SynchronizedBatchNorm1d,
                                                   SynchronizedBatchNorm3d]
    assert inner[1].weight is weight and inner[1].momentum == 0.3 and inner[6].eps == 1e-3
    bare = convert_model(_bn_net())
    assert type(bare[3]) is SynchronizedBatchNorm1d


def test_convert_model_gives_replicas_full_batch_statistics():
    torch.manual_seed(2)
    plain = _bn_net()
    converted = convert_model(DataParallelWithCallback(copy.deepcopy(plain), ["cpu"] * 3))
    x = torch.randn(7, 3, 3, 3, dtype=torch.float64)
    close(converted(x), plain(x))


def test_patch_sync_batchnorm_builds_synchronised_layers_then_restores():
    with patch_sync_batchnorm():
        net = nn.Sequential(nn.BatchNorm1d(2), nn.BatchNorm2d(2), nn.BatchNorm3d(2))
    assert [type(m) for m in net] == [SynchronizedBatchNorm1d, SynchronizedBatchNorm2d, SynchronizedBatchNorm3d]
    assert type(nn.BatchNorm2d(2)) is torch.nn.modules.batchnorm.BatchNorm2d


def test_revert_sync_batchnorm_gives_plain_batchnorm_with_the_same_state():
    net = nn.Sequential(SyncBatchNorm(3), BatchNorm2d(3), nn.SyncBatchNorm(3, momentum=None)).double()
    net[0].running_mean.fill_(0.5)
    weight = net[1].weight
    reverted = revert_sync_batchnorm(net)
    assert not any(isinstance(m, (SyncBatchNorm, nn.SyncBatchNorm)) for m in reverted.modules())
    assert type(reverted[1]) is nn.BatchNorm2d and reverted[1].weight is weight
    assert isinstance(reverted[0], nn.modules.batchnorm._BatchNorm) and reverted[2].momentum is None
    assert torch.equal(reverted[0].running_mean, torch.full((3,), 0.5, dtype=torch.float64))
    x = torch.randn(5, 3, 2, dtype=torch.float64)  # the dimension-agnostic layer accepts any (N, C, *) input
    close(reverted[0](x), F.batch_norm(x, None, None, training=True))


def test_is_module_wrapper_recognises_ours_and_torchs():
    net = nn.Linear(2, 2)
    assert is_module_wrapper(DataParallelModel(net, CPU2))
    assert is_module_wrapper(DataParallelWithCallback(net, CPU2))
    assert is_module_wrapper(nn.DataParallel(net, device_ids=[]))
    assert is_module_wrapper(DataParallelCriterion(nn.MSELoss(), CPU2))
    assert not is_module_wrapper(net)
    ddp = nn.parallel.DistributedDataParallel.__new__(nn.parallel.DistributedDataParallel)
    assert is_module_wrapper(ddp)


# ----------------------------------------------------------------------------------- small PE layers


def test_small_layers_do_what_their_names_say():
    x = torch.randn(2, 3, 4, 5, dtype=torch.float64)
    close(GlobalAvgPool2d()(x), x.mean((2, 3)))
    assert View(2, -1)(x).shape == (2, 60) and View((6, 20))(x).shape == (6, 20)
    close(Sum(1)(x), x.sum(1))
    close(Mean(2, keep_dim=True)(x), x.mean(2, keepdim=True))
    close(Normalize()(x), F.normalize(x, p=2, dim=1, eps=1e-8))
    features = x.flatten(2)
    close(GramMatrix()(x), features @ features.transpose(1, 2) / (3 * 4 * 5))
    branches = ConcurrentModule([nn.Identity(), GlobalAvgPool2d(), nn.Conv2d(3, 2, 1).double()])
    assert isinstance(branches, nn.ModuleList)
    with pytest.raises(RuntimeError):
        branches(x)  # different shapes cannot be concatenated
    ok = ConcurrentModule([nn.Identity(), nn.Conv2d(3, 2, 1).double()])
    close(ok(x), torch.cat([x, ok[1](x)], 1))


def test_label_smoothing_is_cross_entropy_with_smoothed_targets():
    logits = torch.randn(6, 4, dtype=torch.float64)
    target = torch.randint(0, 4, (6,))
    logp = logits.log_softmax(-1)
    expected = (0.9 * -logp.gather(1, target[:, None]).squeeze(1) + 0.1 * -logp.mean(-1)).mean()
    close(LabelSmoothing(0.1)(logits, target), expected)


def test_encoding_drop_redraws_the_smoothing_factors():
    torch.manual_seed(3)
    layer = EncodingDrop(4, 3).double()
    x = torch.randn(2, 4, 3, 3, dtype=torch.float64)
    layer.train()
    layer(x)
    first = layer.scale.detach().clone()
    layer(x)
    assert not torch.equal(first, layer.scale) and bool(((layer.scale >= -1) & (layer.scale <= 0)).all())
    layer.eval()
    plain = Encoding(4, 3).double()
    plain.load_state_dict(layer.state_dict())
    with torch.no_grad():
        plain.scale.fill_(-0.5)
    close(layer(x), plain(x))


def test_dropblock_drops_square_blocks_and_keeps_the_mean():
    torch.manual_seed(4)
    block = DropBlock2D(0.2, 3)
    x = torch.ones(4, 8, 32, 32, dtype=torch.float64)
    block.eval()
    assert torch.equal(block(x), x)
    block.train()
    out = block(x)
    dropped = (out == 0).double().mean().item()
    assert 0.1 < dropped < 0.3
    close(out.mean(), torch.tensor(1.0, dtype=torch.float64))  # survivors are rescaled
    assert torch.equal(DropBlock2D(0.0, 3).train()(x), x)
    shared = DropBlock2D(0.2, 3, share_channel=True).train()(x)
    assert torch.equal(shared[:, :1].expand_as(shared) == 0, shared == 0)


# ----------------------------------------------------------------------------------- transforms


def test_transforms_map_onto_torchvision():
    from PIL import Image
    import torchvision.transforms as T
    from encoding import transforms

    train, val = transforms.get_transform("imagenet", crop_size=32)
    image = Image.new("RGB", (48, 40), (120, 30, 200))
    assert train(image).shape == (3, 32, 32) and val(image).shape == (3, 32, 32)
    assert transforms.Compose is T.Compose and transforms.ToTensor is T.ToTensor
    train, val = transforms.get_transform("cifar10")
    assert val(Image.new("RGB", (32, 32))).shape == (3, 32, 32)
    lighting = transforms.Lighting(0.0)
    tensor = torch.rand(3, 4, 4)
    assert torch.equal(lighting(tensor), tensor)
    with pytest.raises(ValueError, match="dataset"):
        transforms.get_transform("mnist")


def test_top_level_package_exposes_functions_and_transforms():
    """PE's module paths are attributes of the package (``import encoding`` imports them, as PE's did:
    tests/test_peers_pe.py checks it in a fresh interpreter)."""
    from encoding.legacy import functions as moved, transforms as moved_transforms

    assert encoding.functions is functions
    assert hasattr(encoding, "transforms")
    assert functions.batchnormtrain is moved.batchnormtrain and functions.scaled_l2 is moved.scaled_l2
    assert encoding.transforms.get_transform is moved_transforms.get_transform


# ------------------------------------------------------- PE's later names (issue 23 item 9), PE's documented maths


def test_batchnormtrain_is_normalisation_with_given_statistics():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 4, 5, dtype=torch.float64, generator=g)
    mean, gamma, beta = (torch.randn(4, dtype=torch.float64, generator=g) for _ in range(3))
    std = torch.rand(4, dtype=torch.float64, generator=g) + 0.5
    want = torch.stack([(x[:, c] - mean[c]) / std[c] * gamma[c] + beta[c] for c in range(4)], 1)
    close(encoding.functions.batchnormtrain(x, mean, std, gamma, beta), want)
    x2 = x[:, :, 0]  # N x C
    close(encoding.functions.batchnormtrain(x2, mean, std, gamma, beta), (x2 - mean) / std * gamma + beta)
    inputs = tuple(t.clone().requires_grad_() for t in (x, mean, std, gamma, beta))
    assert torch.autograd.gradcheck(encoding.functions.batchnormtrain, inputs)
    with pytest.raises(ValueError, match="N x C"):
        encoding.functions.batchnormtrain(x[0, 0], mean, std, gamma, beta)


def _greedy_nms(boxes, scores, threshold):
    """The plain greedy NMS of PE's kernel on (x, y, w, h) boxes: the kept positions in score order."""
    order = sorted(range(len(scores)), key=lambda i: -float(scores[i]))
    kept = []
    for pos, i in enumerate(order):
        x, y, w, h = boxes[i].tolist()
        def iou(j):
            x2, y2, w2, h2 = boxes[j].tolist()
            inter = max(0.0, min(x + w, x2 + w2) - max(x, x2)) * max(0.0, min(y + h, y2 + h2) - max(y, y2))
            return inter / (w * h + w2 * h2 - inter)
        if all(iou(order[k]) <= threshold for k in kept):
            kept.append(pos)
    return order, kept


def test_non_max_suppression_has_pe_signature_and_greedy_semantics():
    g = torch.Generator().manual_seed(3)
    boxes = torch.cat([torch.rand(2, 30, 2, generator=g) * 10, torch.rand(2, 30, 2, generator=g) * 6 + 1], -1)
    scores = torch.rand(2, 30, generator=g)
    mask, indices = encoding.functions.NonMaxSuppression(boxes.double(), scores.double(), 0.3)
    assert mask.shape == indices.shape == (2, 30) and mask.dtype == torch.bool
    for b in range(2):
        order, kept = _greedy_nms(boxes[b].double(), scores[b].double(), 0.3)
        assert indices[b].tolist() == order
        assert mask[b].nonzero().flatten().tolist() == kept
        assert 0 < len(kept) < 30
    # PE's docstring example: the third box overlaps the first (IoU > 0.7) and is dropped if it scores lower
    example = torch.tensor([[[10., 20., 20., 15.], [24., 22., 50., 54.], [10., 21., 20., 14.5]]])
    mask, indices = encoding.functions.NonMaxSuppression(example, torch.tensor([[0.9, 0.5, 0.8]]), 0.7)
    assert indices[mask].tolist() == [0, 1]
    with pytest.raises(ValueError, match="N x n x 4"):
        encoding.functions.NonMaxSuppression(example[0], torch.ones(3), 0.5)


def test_set_sbn_eps_mode_accepts_our_mode_and_refuses_clip():
    encoding.nn.set_sbn_eps_mode("plus")
    with pytest.raises(ValueError, match="'clip' is not provided"):
        encoding.nn.set_sbn_eps_mode("clip")


def test_upsample_conv2d_is_a_convolution_then_pixel_shuffle():
    layer = encoding.nn.UpsampleConv2d(4, 3, 3, padding=1, scale_factor=2).double()
    assert layer.weight.shape == (12, 4, 3, 3) and layer.bias.shape == (12,)
    bound = 1 / (4 * 9) ** 0.5
    assert layer.weight.abs().max() <= bound
    x = torch.randn(2, 4, 5, 6, dtype=torch.float64)
    conv = F.conv2d(x, layer.weight, layer.bias, padding=1)  # 2 x 12 x 5 x 6
    want = torch.empty(2, 3, 10, 12, dtype=torch.float64)
    for c in range(3):
        for i in range(2):
            for j in range(2):  # pixel shuffle: channel c*s² + i*s + j fills (i, j) of each 2 x 2 cell
                want[:, c, i::2, j::2] = conv[:, c * 4 + i * 2 + j]
    close(layer(x), want)
    with pytest.raises(ValueError, match="divisible by groups"):
        encoding.nn.UpsampleConv2d(4, 3, 3, groups=2)


def test_inspiration_matches_the_target_gram_matrix():
    layer = encoding.nn.Inspiration(3).double()
    assert layer.weight.shape == (1, 3, 3) and 0 <= layer.weight.min() and layer.weight.max() <= 0.02
    style = torch.randn(1, 3, 4, 4, dtype=torch.float64)
    layer.setTarget(encoding.nn.GramMatrix()(style))
    x = torch.randn(2, 3, 4, 5, dtype=torch.float64)
    P = layer.weight[0] @ layer.G[0]
    want = torch.einsum("dc,ndl->ncl", P, x.flatten(2)).view_as(x)  # Y = (W G)ᵀ X per image
    close(layer(x), want)
    assert "G" not in layer.state_dict()


def test_encoding_cosine_uses_dot_product_assignments():
    layer = encoding.nn.EncodingCosine(D=4, K=3).double()
    x = torch.randn(2, 4, 3, 2, dtype=torch.float64)
    X = x.flatten(2).transpose(1, 2)  # B x N x D
    A = torch.softmax(X @ layer.codewords.t(), dim=2)
    want = (A.unsqueeze(-1) * (X.unsqueeze(2) - layer.codewords)).sum(1)
    close(layer(x), want)
    close(layer(x.flatten(2)), want)


def test_conv_bn_act_has_pe_submodules_and_refuses_what_is_missing():
    block = encoding.nn.ConvBnAct(3, 5, 3, padding=1)
    assert list(dict(block.named_children())) == ["conv", "bn", "relu"]
    assert isinstance(block.bn, nn.BatchNorm2d) and block(torch.randn(2, 3, 4, 4)).min() >= 0
    assert list(dict(encoding.nn.ConvBnAct(3, 5, 1, act=False).named_children())) == ["conv", "bn"]
    with pytest.raises(ValueError, match="SplAtConv2d / RFConv2d"):
        encoding.nn.ConvBnAct(3, 5, 3, radix=2)


def test_nll_multilabel_smooth_on_soft_targets():
    loss = encoding.nn.NLLMultiLabelSmooth(0.2)
    x = torch.randn(4, 5, dtype=torch.float64)
    t = torch.softmax(torch.randn(4, 5, dtype=torch.float64), 1)
    logp = torch.log_softmax(x, -1)
    want = (0.8 * -(logp * t).sum(-1) + 0.2 * -logp.mean(-1)).mean()
    close(loss(x, t), want)
    hard = torch.tensor([0, 2, 1, 4])
    close(loss.eval()(x, hard), F.cross_entropy(x, hard))


@pytest.mark.parametrize("mode", ["val", "testval", "test"])
def test_pytorch_encodings_v1_image_transform_gives_the_default_sample(shapes_root, mode):
    """PE's scripts pass ``transforms.Compose([ToTensor(), Normalize(mean, std)])``, whose ToTensor wants a PIL image:
    it gets one, and the sample is the default pipeline's (every sample raised a TypeError)."""
    from torchvision import transforms

    from encoding.datasets import get_segmentation_dataset

    pe = transforms.Compose([transforms.ToTensor(), transforms.Normalize([.485, .456, .406], [.229, .224, .225])])
    common = dict(root=str(shapes_root), split="val", mode=mode, num_train=8, num_val=4, progress=False,
                  base_size=40, crop_size=32)
    ours, theirs = (get_segmentation_dataset("shapes", **common, **extra)[0] for extra in ({}, {"transform": pe}))
    torch.testing.assert_close(theirs[0], ours[0], rtol=0, atol=1e-6)
    assert theirs[0].dtype == torch.float32
    assert theirs[1] == ours[1] if mode == "test" else torch.equal(theirs[1], ours[1])  # the name, or the mask


def test_pytorch_encodings_test_py_collate_and_per_image_evaluation(shapes_root):
    """PE's test.py: ``DataLoader(testset, collate_fn=test_batchify_fn)`` gives lists of images of any sizes, and
    ``MultiEvalModule.parallel_forward(images)`` their logits, one ``1 x nclass x H x W`` each."""
    from torch.utils.data import DataLoader

    from encoding.datasets import get_segmentation_dataset
    from encoding.models import MultiEvalModule, get_segmentation_model

    testset = get_segmentation_dataset("shapes", root=str(shapes_root), split="val", mode="test", num_train=8,
                                       num_val=4, progress=False, base_size=40, crop_size=32)
    with pytest.warns(FutureWarning, match="test_batchify_fn is an old name"):
        from encoding.datasets import test_batchify_fn
        images, names = next(iter(DataLoader(testset, batch_size=3, collate_fn=test_batchify_fn)))
    assert isinstance(images, list) and len(images) == 3 and names == [testset[i][1] for i in range(3)]
    model = get_segmentation_model("unet", dataset="shapes", backbone="vgg_tiny").eval()
    evaluator = MultiEvalModule(model, testset.num_class, base_size=40, crop_size=32, scales=(1.0,))
    outputs = evaluator.parallel_forward(images)
    for image, output in zip(images, outputs):
        assert output.shape == (1, testset.num_class, *image.shape[-2:])
        torch.testing.assert_close(output, evaluator(image.unsqueeze(0)))
