"""SegmentationLosses / OhemCrossEntropy (``encoding.nn.loss``'s cross-entropy family): values against plain torch
formulas, input forms, errors, and exact reduction under DataParallelCriterion (float64, 3 CPU replicas, 3/2/2 split,
value and gradients: the shared ``assert_replicated_step_is_exact``)."""
import pytest
import torch
import torch.nn.functional as F
from conftest import assert_replicated_step_is_exact, uneven_batch
from torch import nn

from encoding.nn import OhemCrossEntropy, SegmentationLosses
from encoding.nn import loss as core_loss
from encoding.parallel import DataParallelCriterion, DataParallelModel, reduce_loss_terms

NCLASS = 5
DEVICES = ["cpu"] * 3


def _outputs(batch=3, size=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = torch.randn(batch, NCLASS, size, size, generator=g, dtype=torch.float64)
    aux = torch.randn(batch, NCLASS, size, size, generator=g, dtype=torch.float64)
    se = torch.randn(batch, NCLASS, generator=g, dtype=torch.float64)
    target = torch.randint(-1, NCLASS, (batch, size, size), generator=g)
    target[0, :2] = -1
    return out, aux, se, target


def _presence_reference(target):
    """Class-present vector per image, computed one image at a time from Python sets."""
    rows = []
    for image in target:
        present = set(image[image >= 0].tolist())
        rows.append([1.0 if c in present else 0.0 for c in range(NCLASS)])
    return torch.tensor(rows, dtype=torch.float64)


@pytest.mark.parametrize("se_loss,aux", [(False, False), (True, False), (False, True), (True, True)])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_matches_plain_formula(se_loss, aux, weighted, smoothing):
    out, aux_out, se, target = _outputs()
    weight = torch.linspace(0.5, 2.0, NCLASS, dtype=torch.float64) if weighted else None
    criterion = SegmentationLosses(se_loss=se_loss, aux=aux, nclass=NCLASS, weight=weight, aux_weight=0.3,
                                   se_weight=0.7, label_smoothing=smoothing)
    output = {"out": out, "aux": aux_out, "se": se}
    expected = F.cross_entropy(out, target, weight=weight, ignore_index=-1, label_smoothing=smoothing)
    if aux:
        expected = expected + 0.3 * F.cross_entropy(aux_out, target, weight=weight, ignore_index=-1,
                                                     label_smoothing=smoothing)
    if se_loss:  # PyTorch-Encoding: BCELoss(weight)(sigmoid(se), present)
        expected = expected + 0.7 * F.binary_cross_entropy(torch.sigmoid(se), _presence_reference(target),
                                                           weight=weight)
    torch.testing.assert_close(criterion(output, target), expected, rtol=0, atol=1e-12)


def test_output_forms_agree():
    out, aux, se, target = _outputs()
    criterion = SegmentationLosses(se_loss=True, aux=True)
    by_dict = criterion({"out": out, "aux": aux, "se": se, "extra": out}, target)
    by_tuple = criterion((out, se, aux), target)  # PyTorch-Encoding order: out, se, aux
    by_flat = criterion(out, se, aux, target)  # PyTorch-Encoding call
    assert by_dict.item() == by_tuple.item() == by_flat.item()
    plain = SegmentationLosses()
    assert plain(out, target).item() == plain((out,), target).item() == plain({"out": out, "aux": aux}, target).item()


def test_loss_terms_are_sums_and_counts():
    out, aux, se, target = _outputs()
    weight = torch.rand(NCLASS, dtype=torch.float64)
    criterion = SegmentationLosses(se_loss=True, aux=True, weight=weight, aux_weight=0.4, se_weight=0.2)
    main, aux_term, se_term = criterion.loss_terms({"out": out, "aux": aux, "se": se}, target)
    valid = target >= 0
    assert main.count.item() == pytest.approx(weight[target[valid]].sum().item())
    assert (main.weight, aux_term.weight, se_term.weight) == (1.0, 0.4, 0.2)
    assert se_term.count == out.shape[0] * NCLASS
    assert reduce_loss_terms([[main]]).item() == pytest.approx(
        F.cross_entropy(out, target, weight=weight, ignore_index=-1).item(), abs=1e-12)


def test_bad_target_values_raise_naming_them():
    out, _, _, target = _outputs()
    target[1, 0, 0], target[2, 3, 3], target[0, 5, 5] = 7, -3, 9
    with pytest.raises(ValueError, match=r"\[-3, 7, 9\].*outside \[0, 5\)"):
        SegmentationLosses()(out, target)
    with pytest.raises(ValueError, match=r"\[5\]"):
        SegmentationLosses(nclass=NCLASS)(out, torch.full_like(target, NCLASS))


def test_custom_ignore_index_is_accepted():
    out, _, _, target = _outputs()
    target255 = target.masked_fill(target < 0, 255)
    loss = SegmentationLosses(ignore_index=255)(out, target255)
    torch.testing.assert_close(loss, F.cross_entropy(out, target, ignore_index=-1))
    with pytest.raises(ValueError, match=r"\[-1\]"):  # -1 is not ignored when ignore_index=255
        SegmentationLosses(ignore_index=255)(out, target)


def test_malformed_outputs_raise():
    out, aux, se, target = _outputs()
    with pytest.raises(ValueError, match="'aux'"):
        SegmentationLosses(aux=True)({"out": out}, target)
    with pytest.raises(ValueError, match="'se'"):
        SegmentationLosses(se_loss=True)({"out": out, "aux": aux}, target)
    with pytest.raises(ValueError, match=r"\(out, se, aux\)"):
        SegmentationLosses(se_loss=True, aux=True)((out, aux), target)
    with pytest.raises(ValueError, match="nclass=4"):
        SegmentationLosses(nclass=4)(out, target)
    with pytest.raises(ValueError, match="target must be"):
        SegmentationLosses()(out, target[:, :3])
    with pytest.raises(ValueError, match="se output"):
        SegmentationLosses(se_loss=True)((out, se[:, :2]), target)
    with pytest.raises(TypeError):
        SegmentationLosses()(out)


class _SegNet(nn.Module):
    """Tiny network with the model contract: {"out", "aux", "se"} at input resolution."""

    def __init__(self):
        super().__init__()
        self.body = nn.Conv2d(3, 8, 3, padding=1)
        self.head = nn.Conv2d(8, NCLASS, 1)
        self.aux = nn.Conv2d(8, NCLASS, 1)
        self.se = nn.Linear(8, NCLASS)

    def forward(self, x):
        feat = torch.relu(self.body(x))
        return {"out": self.head(feat), "aux": self.aux(feat), "se": self.se(feat.mean((2, 3)))}


@pytest.mark.parametrize("criterion", [
    SegmentationLosses(se_loss=True, aux=True, nclass=NCLASS),
    SegmentationLosses(se_loss=True, aux=True, weight=torch.linspace(0.2, 3.0, NCLASS, dtype=torch.float64),
                       label_smoothing=0.1),
], ids=["plain", "weighted-smoothed"])
def test_data_parallel_criterion_is_exact(criterion):
    """3 replicas, 3/2/2 split, uneven ignore masks: the loss and the parameter gradients equal the whole batch's,
    while PyTorch-Encoding's unweighted mean of per-replica losses is visibly off (the test can fail)."""
    torch.manual_seed(0)
    net = _SegNet().double()
    x, target = uneven_batch(NCLASS)
    assert_replicated_step_is_exact(net, net, criterion, x, target, DEVICES, [3, 2, 2], atol=1e-10, rtol=0,
                                    grad_rtol=0, grad_atol=1e-10, naive_gap=1e-3)


class _PENet(_SegNet):
    """The same network returning PyTorch-Encoding's tuple ``(out, se, aux)``."""

    def forward(self, x):
        output = super().forward(x)
        return output["out"], output["se"], output["aux"]


@pytest.mark.parametrize("cls,options", [(SegmentationLosses, {}), (OhemCrossEntropy, {"thresh": 0.9, "min_kept": 5})],
                         ids=["SegmentationLosses", "OhemCrossEntropy"])
def test_pe_layouts_reduce_exactly_like_the_core(cls, options):
    """encoding.nn's classes (the core classes: one class each) on PE tuples == on dicts, also across replicas."""
    core_cls = getattr(core_loss, cls.__name__)
    assert cls is core_cls
    torch.manual_seed(0)
    net = _PENet().double()
    x, target = uneven_batch(NCLASS, seed=1)
    single = core_cls(se_loss=True, aux=True, nclass=NCLASS, **options)(dict(zip(("out", "se", "aux"), net(x))),
                                                                         target)
    criterion = cls(se_loss=True, aux=True, nclass=NCLASS, **options)
    torch.testing.assert_close(criterion(*net(x), target), single, rtol=0, atol=0)
    loss = DataParallelCriterion(criterion, DEVICES)(DataParallelModel(net, DEVICES)(x), target)
    torch.testing.assert_close(loss, single, rtol=0, atol=1e-10)


def _ohem_reference(logits, target, thresh, min_kept):
    """Straightforward OHEM: sort the true-class probabilities of the valid pixels, pick the threshold, average."""
    prob = F.softmax(logits, 1)
    pixels = []
    for b, i, j in (target >= 0).nonzero().tolist():
        pixels.append((prob[b, target[b, i, j], i, j].item(), b, i, j))
    probs = sorted(p for p, *_ in pixels)
    threshold = thresh
    if min_kept > 0 and probs:
        threshold = max(thresh, probs[min(min_kept, len(probs)) - 1])
    kept = target.clone().fill_(-1)
    for p, b, i, j in pixels:
        if p <= threshold:
            kept[b, i, j] = target[b, i, j]
    return F.cross_entropy(logits, kept, ignore_index=-1)


@pytest.mark.parametrize("thresh,min_kept", [(0.7, 0), (0.7, 20), (0.05, 60), (0.3, 1000)])
def test_ohem_matches_reference(thresh, min_kept):
    out, _, _, target = _outputs(seed=3)
    loss = OhemCrossEntropy(thresh=thresh, min_kept=min_kept)(out, target)
    torch.testing.assert_close(loss, _ohem_reference(out, target, thresh, min_kept), rtol=0, atol=1e-12)


def test_ohem_keeps_all_pixels_when_fewer_than_min_kept():
    out, _, _, target = _outputs(seed=4)
    loss = OhemCrossEntropy(thresh=0.0, min_kept=10 ** 6)(out, target)
    torch.testing.assert_close(loss, F.cross_entropy(out, target, ignore_index=-1), rtol=0, atol=1e-12)


def test_ohem_under_data_parallel_is_exact_when_threshold_decides():
    torch.manual_seed(0)
    net = _SegNet().double()
    x, target = uneven_batch(NCLASS, seed=1)
    criterion = OhemCrossEntropy(thresh=0.9, min_kept=5, aux=True, se_loss=True)
    outputs = DataParallelModel(net, DEVICES)(x)
    for output, part in zip(outputs, target.split([3, 2, 2])):  # the premise: every replica has enough hard pixels
        hard = criterion.hard_pixels(output["out"], part, part >= 0)
        assert hard.sum() >= 5
    assert_replicated_step_is_exact(net, net, criterion, x, target, DEVICES, [3, 2, 2], atol=1e-10, rtol=0,
                                    grad_rtol=0, grad_atol=1e-10)


@pytest.mark.parametrize("weighted,smoothing", [(False, 0.0), (True, 0.1)])
def test_ohem_under_data_parallel_is_exact_when_min_kept_decides(weighted, smoothing):
    """Nothing is hard by the threshold, so ``min_kept`` picks the pixels: over the whole batch, not per replica."""
    torch.manual_seed(0)
    net = _SegNet().double()
    x, target = uneven_batch(NCLASS, seed=1)
    weight = torch.linspace(0.5, 2.0, NCLASS, dtype=torch.float64) if weighted else None
    criterion = OhemCrossEntropy(thresh=0.0, min_kept=40, aux=True, se_loss=True, weight=weight,
                                 label_smoothing=smoothing)
    with torch.no_grad():
        whole = criterion.hard_pixels(net(x)["out"], target, target >= 0).sum()
        per_replica = sum(criterion.hard_pixels(net(part)["out"], t, t >= 0).sum()
                          for part, t in zip(x.split([3, 2, 2]), target.split([3, 2, 2])))
    assert whole == 40 and per_replica > whole  # the premise: mining per replica would keep other pixels
    assert_replicated_step_is_exact(net, net, criterion, x, target, DEVICES, [3, 2, 2], atol=1e-10, rtol=0,
                                    grad_rtol=0, grad_atol=1e-10)


def test_constructor_validates():
    with pytest.raises(ValueError, match="weight"):
        SegmentationLosses(nclass=NCLASS, weight=torch.ones(3))
    with pytest.raises(ValueError, match="nclass"):
        SegmentationLosses(nclass=0)
    with pytest.raises(ValueError, match="thresh"):
        OhemCrossEntropy(thresh=1.5)
    with pytest.raises(ValueError, match="min_kept"):
        OhemCrossEntropy(min_kept=-1)
