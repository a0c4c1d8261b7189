"""Issue 34, item 6: a detector's lists of images and targets, a model that installs hooks on its first call, and the
inexact-reduction advice, each compared with the plain model on every replica's slice (float64)."""
import copy
import warnings

import pytest
import torch
from torch import nn

from encoding.parallel import DataParallelCriterion, DataParallelModel, PerSample, replicate, scatter
from encoding.parallel.criterion import InexactReductionWarning

CPU2 = ["cpu", "cpu"]
TOL = dict(rtol=1e-6, atol=1e-6)


def _detector():
    from torchvision.models.detection import fasterrcnn_mobilenet_v3_large_320_fpn
    torch.manual_seed(0)
    # every proposal and anchor is sampled (batch sizes far above their counts): the losses are deterministic
    return fasterrcnn_mobilenet_v3_large_320_fpn(
        weights=None, weights_backbone=None, num_classes=3, min_size=64, max_size=96,
        rpn_batch_size_per_image=100000, box_batch_size_per_image=100000, rpn_pre_nms_top_n_train=50,
        rpn_post_nms_top_n_train=20, rpn_pre_nms_top_n_test=50, rpn_post_nms_top_n_test=20).double()


def _detection_batch(n=3):
    torch.manual_seed(1)
    images = [torch.rand(3, 40 + 8 * i, 48, dtype=torch.float64) for i in range(n)]
    boxes = torch.tensor([[2., 3, 20, 30], [5, 5, 30, 25], [1, 1, 10, 12]], dtype=torch.float64)
    targets = [{"boxes": boxes + i, "labels": torch.tensor([1, 2, 1])} for i in range(n)]  # 3 boxes, 3 channels
    return images, targets


def test_detector_images_and_targets_are_scattered_per_sample():
    """Before: every 3xHxW image was split along its channels (3 boxes each: no error, wrong losses)."""
    model = _detector().train()
    plain = copy.deepcopy(model)
    images, targets = _detection_batch()
    outputs = DataParallelModel(model, CPU2)(images, targets)
    assert outputs.split_sizes == [2, 1]
    for output, (a, b) in zip(outputs, [(0, 2), (2, 3)]):
        expected = plain(images[a:b], targets[a:b])
        assert output.keys() == expected.keys()
        for key in expected:
            torch.testing.assert_close(output[key], expected[key], **TOL)
    criterion = DataParallelCriterion(lambda losses: sum(losses.values()), CPU2)
    with pytest.warns(InexactReductionWarning) as record:
        loss = criterion(outputs)
    advice = str(record[0].message)
    assert "computes its own losses" in advice and "CrossEntropyLoss" not in advice
    loss.backward()
    assert all(p.grad is not None for p in model.roi_heads.parameters())


def test_detector_images_alone_need_per_sample():
    """A lone list of CHW images reads as samples and as batched tensors alike: refused, naming PerSample."""
    model = _detector().eval()
    images, _ = _detection_batch()
    wrapped = DataParallelModel(model, CPU2)
    with pytest.raises(ValueError, match=r"PerSample.*tuple"):
        wrapped(images)
    with torch.no_grad():
        outputs = wrapped(PerSample(images))
        for output, (a, b) in zip(outputs, [(0, 2), (2, 3)]):
            expected = model(images[a:b])
            assert len(output) == len(expected) == b - a
            for got, want in zip(output, expected):
                for key in want:
                    torch.testing.assert_close(got[key], want[key], **TOL)


def test_list_rules():
    x = torch.arange(12.0).view(6, 2)
    # batched tensors in a list next to a batched tensor: split along dim 0, as torch does
    parts = scatter((x, [x + 1, x + 2]), CPU2)
    assert [p[1][0].shape[0] for p in parts] == [3, 3]
    # a list of six samples next to a 6-sample tensor: per sample (each replica gets whole samples)
    samples = [torch.zeros(2, 5) for _ in range(6)]
    parts = scatter((x, samples), CPU2)
    assert [len(p[1]) for p in parts] == [3, 3] and all(t.shape == (2, 5) for p in parts for t in p[1])
    # a list that reads either way is refused, and the size mismatch names PerSample
    with pytest.raises(ValueError, match="PerSample"):
        scatter(([torch.zeros(2, 4), torch.zeros(2, 5)],), CPU2)
    with pytest.raises(ValueError, match="PerSample"):
        scatter((x, [torch.zeros(4, 1)] * 5), CPU2)
    # the same call as a tuple of batched tensors is unambiguous
    assert [p[0][1].shape[0] for p in scatter(((torch.zeros(2, 4), torch.zeros(2, 5)),), CPU2)] == [1, 1]


def _segformer():
    from transformers import SegformerConfig, SegformerForSemanticSegmentation
    torch.manual_seed(0)
    config = SegformerConfig(num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[8, 16],
                             patch_sizes=[7, 3], strides=[4, 2], num_attention_heads=[1, 2], mlp_ratios=[2, 2],
                             decoder_hidden_size=16, num_labels=3, hidden_dropout_prob=0.0,
                             attention_probs_dropout_prob=0.0, classifier_dropout_prob=0.0, drop_path_rate=0.0)
    return SegformerForSemanticSegmentation(config).double()


def _hooks(model):
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())


@pytest.mark.parametrize("train", [False, True])
def test_transformers_model_that_hooks_on_first_call_works_wrapped(train):
    """Before: a fresh Segformer crashed (mat1 and mat2 shapes) and the original kept 24 forward hooks."""
    model = _segformer().train(train)
    plain = copy.deepcopy(model)
    before = _hooks(model)
    x = torch.randn(3, 3, 32, 32, dtype=torch.float64)
    outputs = DataParallelModel(model, CPU2)(pixel_values=x)
    assert _hooks(model) == before
    for output, (a, b) in zip(outputs, [(0, 2), (2, 3)]):
        torch.testing.assert_close(output.logits, plain(pixel_values=x[a:b]).logits, **TOL)
    torch.testing.assert_close(model(pixel_values=x).logits, plain(pixel_values=x).logits, **TOL)


def test_replicas_add_nothing_to_the_original():
    class Recorder(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(2, 2)
            self.seen, self.cache = [], {}

        def forward(self, x):
            if not self.lin._forward_hooks:
                self.lin.register_forward_hook(lambda module, args, out: out * 2)
            self.seen.append(x.shape[0])
            self.cache[x.shape[0]] = True
            return self.lin(x)

    module = Recorder()
    x = torch.randn(5, 2)
    outputs = DataParallelModel(module, ["cpu"] * 3)(x)
    assert not module.lin._forward_hooks and module.seen == [] and module.cache == {}
    torch.testing.assert_close(torch.cat(list(outputs)), module.lin(x) * 2)
    replicas = replicate(module, CPU2)
    assert replicas[0].lin._forward_hooks is not module.lin._forward_hooks


def test_inexact_advice_fits_the_output():
    def advice(output, target):
        criterion = DataParallelCriterion(lambda out, y: (out - y).abs().mean(), CPU2)
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            criterion(DataParallelModel(nn.Identity(), CPU2)(output), target)
        return " ".join(str(w.message) for w in record if issubclass(w.category, InexactReductionWarning))

    classifier = advice(torch.randn(5, 4), torch.randn(5, 4))
    assert "torch loss module" in classifier and "ignore_index=255" not in classifier
    segmentation = advice(torch.randn(5, 3, 4, 4), torch.randn(5, 3, 4, 4))
    assert "output_key='out'" in segmentation


def test_criterion_targets_and_explicit_splits_know_the_batch():
    """Split sizes given (the criterion's targets, chunk_sizes) fix the batch: a lone list of three batched targets
    (refused without them: it reads either way) is split along dim 0, and a detector's lists still go per sample."""
    x = torch.arange(4.0).view(2, 2)
    with pytest.raises(ValueError, match="PerSample"):
        scatter(([x, x + 1, x + 2],), CPU2)
    parts = scatter(([x, x + 1, x + 2],), CPU2, split_sizes=[1, 1])
    assert [[t.shape for t in p[0]] for p in parts] == [[(1, 2)] * 3] * 2
    model = _detector().train()
    images, targets = _detection_batch()
    wrapped = DataParallelModel(model, CPU2, chunk_sizes=[1, 2])
    outputs = wrapped(images, targets)
    assert outputs.split_sizes == [1, 2]
    torch.testing.assert_close(outputs[1]["loss_classifier"],
                               copy.deepcopy(model)(images[1:], targets[1:])["loss_classifier"], **TOL)


def test_per_sample_list_outputs_are_gathered_in_input_order():
    """A detector in eval mode returns one result dict per image. Before: gather joined the replicas' lists element
    by element: a 2 + 1 split was refused (different structure), a 2 + 2 split silently merged image 0's detections
    with image 2's. Now each replica's list (as long as its share) is concatenated in input order."""
    from encoding.parallel import DataParallelWithCallback

    model = _detector().eval()
    torch.manual_seed(2)
    images = [torch.rand(3, 64, 64, dtype=torch.float64) for _ in range(4)]  # one size: the same padding
    with torch.no_grad():
        expected = [model([image])[0] for image in images]
        results = []
        for n in (3, 4):
            wrapped = DataParallelModel(model, CPU2)
            outputs = wrapped(PerSample(images[:n]))
            assert [len(o) for o in outputs] == outputs.split_sizes == ([2, 1] if n == 3 else [2, 2])
            results.append((n, wrapped.gather(outputs)))
        results.append((3, DataParallelWithCallback(model, CPU2)(PerSample(images[:3]))))
    assert any(len(e["boxes"]) for e in expected)  # something detected to compare
    for n, gathered in results:
        assert type(gathered) is list and len(gathered) == n
        for mine, theirs in zip(gathered, expected):
            assert mine.keys() == theirs.keys()
            for key in theirs:
                torch.testing.assert_close(mine[key], theirs[key], **TOL)


def test_lists_of_batched_tensors_are_still_gathered_element_by_element():
    """A model returning ``[out, aux]`` (each batched) keeps torch's gather, even when the list is as long as a
    replica's share."""
    class TwoHeads(nn.Module):
        def forward(self, x):
            return [x * 2, x + 1]

    x = torch.arange(8.0).view(4, 2)
    wrapped = DataParallelModel(TwoHeads(), CPU2)
    out, aux = wrapped.gather(wrapped(x))
    torch.testing.assert_close(out, x * 2)
    torch.testing.assert_close(aux, x + 1)


def test_memory_balance_refuses_lists_of_samples_in_training_and_splits_them_evenly_in_eval():
    """balance="memory" narrows batched tensors to a share; a share of a list of samples holds particular samples
    (and a detector's memory follows its detections, which fake tensors cannot compute). Before: a raw
    ``StopIteration`` (PerSample images) or ``DynamicOutputShapeException`` (a detector) from inside the planner."""
    import encoding.memory  # noqa: F401 - registers balance="memory"

    model = _detector()
    images, targets = _detection_batch()
    wrapped = DataParallelModel(model.train(), CPU2, balance="memory")
    with pytest.raises(ValueError, match=r"balance='memory' cannot plan a call with lists of samples "
                                         r"\(args\[0\], args\[1\]\).*chunk_sizes"):
        wrapped(images, targets)
    with pytest.raises(ValueError, match=r"lists of samples \(args\[0\]\)"):
        wrapped(PerSample(images), targets=None)
    assert DataParallelModel(model.train(), CPU2, chunk_sizes=[2, 1])(images, targets).split_sizes == [2, 1]
    model.eval()
    with torch.no_grad():  # forward only: the even split, no simulation; the results gathered per image
        outputs = wrapped(PerSample(images))
        assert outputs.split_sizes == [2, 1] and len(wrapped.gather(outputs)) == 3


def test_list_outputs_that_read_both_ways_after_sample_inputs_are_refused():
    """Lists of samples in, and each replica returns a list as long as its share of tensors of that size: samples
    or batched tensors? Refused naming PerSample, never joined the wrong way."""
    class FirstTwo(nn.Module):
        def forward(self, images):
            return [image[:2].mean(dim=(1, 2)) for image in images]  # 2 values per image; shares of 2

    images = [torch.rand(3, 8, 8) for _ in range(4)]
    wrapped = DataParallelModel(FirstTwo(), CPU2)
    outputs = wrapped(PerSample(images))
    with pytest.raises(ValueError, match="samples or batched tensors.*PerSample"):
        wrapped.gather(outputs)
    fewer = wrapped(PerSample(images[:3]))  # shares 2 and 1: only the per-sample reading fits
    torch.testing.assert_close(torch.stack(wrapped.gather(fewer)),
                               torch.stack([image[:2].mean(dim=(1, 2)) for image in images[:3]]))


class _TwoHeads(nn.Module):
    """A PyTorch-Encoding-style model: a tuple of two outputs."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Conv2d(3, 4, 1), nn.Conv2d(3, 4, 1)

    def forward(self, x):
        return self.a(x), self.b(x)


class _ApartLoss(nn.CrossEntropyLoss):
    """DANet's SegmentationMultiLosses pattern: PE's DataParallelCriterion called criterion(*output, *targets)."""

    def forward(self, *inputs):
        first, second, target = inputs
        return super().forward(first, target) + 0.4 * super().forward(second, target)


class _WholeLoss(nn.Module):
    """This package's call: the tuple as one argument (a sum: exact by batch share)."""

    reduction = "sum"

    def forward(self, outputs, target):
        return sum(nn.functional.cross_entropy(o, target, ignore_index=-1, reduction="sum") for o in outputs)


def test_pe_style_criteria_take_a_tuple_output_apart():
    """PE gave a tuple output's parts as separate arguments: its users' losses (forward(self, *inputs), or
    f(pred1, pred2, target)) failed to unpack. They get them apart; a criterion taking the tuple whole gets it whole;
    both equal the plain criterion on the whole batch (float64)."""
    from encoding.parallel.criterion import takes_outputs_apart

    torch.manual_seed(0)
    net = _TwoHeads().double()
    x, target = torch.randn(5, 3, 6, 6, dtype=torch.float64), torch.randint(-1, 4, (5, 6, 6))

    def apart_fn(first, second, target):
        return nn.functional.cross_entropy(first, target, ignore_index=-1) + \
            nn.functional.cross_entropy(second, target, ignore_index=-1)

    cases = [(_ApartLoss(ignore_index=-1, reduction="sum"), True), (_WholeLoss(), False), (apart_fn, True)]
    for criterion, apart in cases:
        assert takes_outputs_apart(criterion, 2, 1, {}) is apart
        plain = criterion(*net(x), target) if apart else criterion(net(x), target)
        for n in (1, 3):
            wrapped = DataParallelCriterion(criterion, device_ids=["cpu"] * n)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                loss = wrapped(DataParallelModel(net, device_ids=["cpu"] * n)(x), target)
            inexact = [w for w in caught if issubclass(w.category, InexactReductionWarning)]
            if n == 1 or criterion is not apart_fn:  # a plain function of means: weighted by share, said once
                assert not inexact and abs(loss.item() - plain.item()) <= 1e-9 * abs(plain.item())
            else:
                assert len(inexact) == 1 and abs(loss.item() - plain.item()) < 0.05 * abs(plain.item())
    assert not takes_outputs_apart(nn.CrossEntropyLoss(), 2, 1, {})  # takes (input, target): whole (refused earlier)
