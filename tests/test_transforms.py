"""encoding.datasets.transforms: the lean path (:class:`LeanCompose`, :func:`transform_pair`) against plain v2.

Every reference here is built from torchvision's v2 classes and our transform classes with ``v2.Compose`` (and the
dataset's loading steps written out as they were before the lean path), so any drift of the lean path -- another
kernel, argument, random draw or draw order -- fails: samples must be bitwise equal (values, dtype, shape, type) and
the torch RNG state afterwards must be the same.
"""
import itertools

import numpy as np
import pytest
import torch
import torchvision.transforms.v2._transform as v2_transform
from PIL import Image
from torch import Tensor
from torchvision import tv_tensors
from torchvision.transforms import v2

from encoding.datasets import get_segmentation_dataset
from encoding.datasets.transforms import (IMAGENET_MEAN, IMAGENET_STD, LeanCompose, PadTo, RandomCropUpTo,
                                          RandomLongSideResize, image_transform, to_index_mask,
                                          train_joint_transform, transform_pair, val_joint_transform)

OTHER_MEAN, OTHER_STD = (0.5, 0.4, 0.3), (0.2, 0.25, 0.3)


# ------------------------------------------------------------------------------------------------------ helpers
@pytest.fixture
def v2_calls(monkeypatch):
    """Counts v2's per-transform machinery (every ``Transform.forward`` flattens its inputs with ``tree_flatten``)."""
    calls = []
    original = v2_transform.tree_flatten

    def counting(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(v2_transform, "tree_flatten", counting)
    return calls


def pair(height, width, seed):
    """A random ``uint8`` image and a mask of classes 0..6 with some 255 (ignore)."""
    g = torch.Generator().manual_seed(seed)
    image = torch.randint(0, 256, (3, height, width), dtype=torch.uint8, generator=g)
    mask = torch.randint(0, 7, (height, width), dtype=torch.uint8, generator=g)
    mask[torch.rand(height, width, generator=g) < 0.1] = 255
    return tv_tensors.Image(image), tv_tensors.Mask(mask)


def assert_same(a, b):
    """Bitwise equal outputs of the same types (a tensor, or a tuple of them)."""
    a, b = (a, b) if isinstance(a, tuple) else ((a,), (b,))
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert type(x) is type(y) and x.dtype == y.dtype and x.shape == y.shape
        assert torch.equal(x.as_subclass(Tensor), y.as_subclass(Tensor))


def run_both(lean, reference, inputs, seed):
    """Outputs and RNG states after ``lean(*inputs)`` and ``reference(*inputs)`` from the same seed."""
    torch.manual_seed(seed)
    out = lean(*inputs)
    state = torch.get_rng_state()
    torch.manual_seed(seed)
    expected = reference(*inputs)
    assert torch.equal(state, torch.get_rng_state()), "the lean path drew other random numbers"
    assert_same(out, expected)
    return out


def train_reference(base_size, crop_size, scale_range, jitter):
    """Today's training recipe as a plain v2.Compose, written out step by step."""
    steps = [v2.RandomHorizontalFlip(0.5), RandomLongSideResize(int(base_size * scale_range[0]),
                                                                int(base_size * scale_range[1])),
             RandomCropUpTo(crop_size)]
    if jitter:
        steps.append(v2.ColorJitter(brightness=jitter, contrast=jitter, saturation=jitter))
    return v2.Compose(steps)


# --------------------------------------------------------------------------------- LeanCompose against v2.Compose
SIZES = [(156, 149), (130, 150), (20, 90), (5, 7), (64, 64)]


@pytest.mark.parametrize("scale_range,jitter,crop_size", list(itertools.product(
    [(1.0, 1.0), (0.5, 2.0), (0.75, 1.5)], [None, 0.4], [32, 64, 200])))
def test_train_transform_equals_v2_compose_sample_for_sample(scale_range, jitter, crop_size, v2_calls):
    lean = train_joint_transform(72, crop_size, scale_range, jitter=jitter)
    reference = train_reference(72, crop_size, scale_range, jitter)
    pad, pad_reference = LeanCompose([PadTo(crop_size)]), PadTo(crop_size)
    for seed, (height, width) in enumerate(SIZES * 3):
        image, mask = pair(height, width, seed)
        del v2_calls[:]
        out = run_both(lean, reference, (image, mask), seed)
        out = run_both(pad, pad_reference, out, seed)  # smaller crops are padded up to crop_size
        assert out[0].shape[-2:] == out[1].shape == (crop_size, crop_size)
        assert len(v2_calls) == 3 + bool(jitter) + 1, "only the references may go through v2's machinery"


def test_no_flip_and_flip_always(v2_calls):
    for flip, p in ((False, None), (True, 1.0)):
        lean = train_joint_transform(40, 32, (0.5, 2.0), flip=flip)
        if p is not None:
            lean.transforms[0].p = p
        reference = v2.Compose(list(lean.transforms))
        for seed in range(6):
            run_both(lean, reference, pair(50, 45, seed), seed)


@pytest.mark.parametrize("crop_size", [32, 64, 120])  # 120: bigger than the image, the centre crop pads
def test_val_transform_equals_v2_compose(crop_size, v2_calls):
    lean, reference = val_joint_transform(crop_size), v2.Compose([v2.Resize(crop_size, antialias=True),
                                                                  v2.CenterCrop(crop_size)])
    for seed, (height, width) in enumerate(SIZES):
        out = run_both(lean, reference, pair(height, width, seed), seed)
        assert out[0].shape[-2:] == (crop_size, crop_size)


@pytest.mark.parametrize("mean,std", [(IMAGENET_MEAN, IMAGENET_STD), (OTHER_MEAN, OTHER_STD)])
def test_image_transform_on_images_plain_tensors_and_batches(mean, std):
    lean = image_transform(mean, std)
    reference = v2.Compose([v2.ToDtype(torch.float32, scale=True), v2.Normalize(list(mean), list(std))])
    image, _ = pair(33, 40, 0)
    for x in (image, image.as_subclass(Tensor), image.as_subclass(Tensor).expand(2, 3, 33, 40)):
        out = run_both(lean, reference, (x,), 0)
        assert type(out) is type(x) and out.dtype == torch.float32


def test_lean_path_keeps_v2_semantics_for_image_only_geometry_and_plain_tensor_pairs():
    steps = [v2.RandomHorizontalFlip(), RandomLongSideResize(20, 60), RandomCropUpTo(24), v2.ColorJitter(0.3, 0.3),
             v2.Compose([v2.ToDtype(torch.float32, scale=True), v2.Normalize(list(OTHER_MEAN), list(OTHER_STD))]),
             PadTo(40, image_fill=0.5, mask_fill=9)]
    lean, reference = LeanCompose(steps), v2.Compose(steps)  # nested composes and fills other than the defaults
    for seed in range(10):
        image, mask = pair(37, 52, seed)
        run_both(lean, reference, (image,), seed)  # a single image: geometry on the image alone
        run_both(lean, reference, (image.as_subclass(Tensor), mask), seed)  # a pure tensor next to a mask
        run_both(lean, reference, (image, mask), seed)


def as_is(*inputs):
    return inputs if len(inputs) > 1 else inputs[0]


class SubclassedFlip(v2.RandomHorizontalFlip):
    def transform(self, inpt, params):
        return inpt  # a subclass may change anything: it must not take the lean form of its base class


@pytest.mark.parametrize("step", [v2.RandomVerticalFlip(), SubclassedFlip(), as_is,
                                  v2.ToDtype({tv_tensors.Image: torch.float32, tv_tensors.Mask: torch.int64})])
def test_unknown_steps_fall_back_to_v2(step, v2_calls):
    lean, reference = LeanCompose([v2.RandomHorizontalFlip(), step]), v2.Compose([v2.RandomHorizontalFlip(), step])
    for seed in range(4):
        del v2_calls[:]
        torch.manual_seed(seed)
        out = lean(*pair(20, 30, seed))
        assert v2_calls, "an unknown step must send the whole compose through v2"
        torch.manual_seed(seed)
        assert_same(out, reference(*pair(20, 30, seed)))


def test_hooks_pil_images_and_mismatched_sizes_take_v2s_path():
    flip = v2.RandomHorizontalFlip(1.0)
    lean = LeanCompose([flip])
    seen = []
    handle = flip.register_forward_hook(lambda module, args, out: seen.append(1))
    lean(*pair(10, 12, 0))
    handle.remove()
    assert seen == [1]  # a hooked step runs as a module
    pil = Image.fromarray(np.arange(60, dtype=np.uint8).reshape(6, 10))
    assert np.array_equal(np.asarray(lean(pil)), np.asarray(pil)[:, ::-1])
    image, _ = pair(10, 12, 0)
    with pytest.raises(ValueError, match="multiple HxW"):  # v2's own error, as before
        LeanCompose([RandomCropUpTo(8)])(image, tv_tensors.Mask(torch.zeros(9, 12, dtype=torch.uint8)))
    with pytest.raises(TypeError, match="float tensor"):  # the kernels' own checks still apply
        LeanCompose([v2.Normalize([0.5] * 3, [0.5] * 3)])(image)


def test_builders_return_inspectable_v2_composes():
    joint = train_joint_transform(72, 64, (1.0, 1.0), jitter=0.4)
    assert isinstance(joint, v2.Compose) and isinstance(joint, v2.Transform)
    assert [type(t) for t in joint.transforms] == [v2.RandomHorizontalFlip, RandomLongSideResize, RandomCropUpTo,
                                                   v2.ColorJitter]
    assert [type(t) for t in val_joint_transform(32).transforms] == [v2.Resize, v2.CenterCrop]
    assert "RandomLongSideResize" in repr(joint)


def test_to_index_mask_maps_ignore_and_keeps_classes():
    mask = tv_tensors.Mask(torch.tensor([[0, 1, 255], [6, 255, 2]], dtype=torch.uint8))
    out = to_index_mask(mask)
    assert type(out) is Tensor and out.dtype == torch.int64
    assert out.tolist() == [[0, 1, -1], [6, -1, 2]]


# ------------------------------------------------------------------------------- datasets against the old loading
def reference_sample(ds, index, joint, image_tf, pad):
    """``BaseDataset._load`` as it was before the lean path: v2 composes called in turn (train / val / testval)."""
    image = ds._read_image(ds.images[index])
    mask = ds._load_mask(index, tuple(image.shape[-2:]))
    if joint is not None:
        image, mask = joint(image, mask)
    image = image_tf(image)
    if pad is not None:
        image, mask = pad(tv_tensors.Image(image), mask)
    mask = mask.as_subclass(Tensor).to(torch.int64)
    mask[mask == 255] = -1
    if ds.target_transform is not None:
        mask = ds.target_transform(mask)
    return image.as_subclass(Tensor) if isinstance(image, Tensor) else image, mask


def check_dataset(ds, joint, image_tf, pad, seeds=range(4)):
    for seed in seeds:
        torch.manual_seed(seed)
        got = [ds[i] for i in range(len(ds))]
        state = torch.get_rng_state()
        torch.manual_seed(seed)
        expected = [reference_sample(ds, i, joint, image_tf, pad) for i in range(len(ds))]
        assert torch.equal(state, torch.get_rng_state())
        for a, b in zip(got, expected):
            assert_same(a, b)


def default_image_tf(mean=IMAGENET_MEAN, std=IMAGENET_STD):
    return v2.Compose([v2.ToDtype(torch.float32, scale=True), v2.Normalize(list(mean), list(std))])


def shapes(root, split="train", **options):
    return get_segmentation_dataset("shapes", root=str(root), split=split, num_train=6, num_val=4, progress=False,
                                    **options)


@pytest.mark.parametrize("scale_range,jitter,crop_size", list(itertools.product(
    [(1.0, 1.0), (0.5, 2.0)], [None, 0.4], [32, 96])))  # 96: larger than the 40-px long side, padded
def test_train_samples_equal_the_old_loading(shapes_root, scale_range, jitter, crop_size):
    ds = shapes(shapes_root, mode="train", base_size=40, crop_size=crop_size, scale_range=scale_range, jitter=jitter,
                mean=OTHER_MEAN, std=OTHER_STD)
    check_dataset(ds, train_reference(40, crop_size, scale_range, jitter), default_image_tf(OTHER_MEAN, OTHER_STD),
                  PadTo(crop_size))


@pytest.mark.parametrize("mode,val_crop,crop_size", [("val", True, 32), ("val", True, 200), ("val", False, 32),
                                                     ("testval", True, 32)])
def test_val_and_testval_samples_equal_the_old_loading(shapes_root, mode, val_crop, crop_size):
    ds = shapes(shapes_root, split="val", mode=mode, crop_size=crop_size, val_crop=val_crop)
    joint = v2.Compose([v2.Resize(crop_size, antialias=True), v2.CenterCrop(crop_size)]) \
        if mode == "val" and val_crop else None
    check_dataset(ds, joint, default_image_tf(), None, seeds=[0])


def test_test_mode_images_equal_the_old_loading(shapes_root):
    ds = shapes(shapes_root, split="val", mode="test")
    for i in range(len(ds)):
        image, name = ds[i]
        assert_same(image, default_image_tf()(ds._read_image(ds.images[i])).as_subclass(Tensor))


@pytest.mark.parametrize("transform", [
    default_image_tf(OTHER_MEAN, OTHER_STD),  # a v2 compose of known steps: lean
    v2.Compose([v2.ColorJitter(0.5, 0.5), v2.ToDtype(torch.float32, scale=True)]),  # photometric: lean
    LeanCompose([v2.RandomHorizontalFlip(), v2.ToDtype(torch.float32, scale=True)]),  # image-only geometry
    lambda im: im.float() / 255,  # any callable: v2's path
])
def test_user_transforms_and_target_transform_equal_the_old_loading(shapes_root, transform):
    ds = shapes(shapes_root, mode="train", base_size=40, crop_size=48, scale_range=(0.75, 1.5), transform=transform,
                target_transform=lambda m: m + 1)
    reference = v2.Compose(list(transform.transforms)) if isinstance(transform, v2.Compose) else transform
    check_dataset(ds, train_reference(40, 48, (0.75, 1.5), None), reference, PadTo(48))


def test_transform_pair_runs_one_lean_pass_or_the_stages_in_turn(v2_calls):
    joint, pad = train_joint_transform(40, 48), LeanCompose([PadTo(48)])
    image, mask = pair(30, 44, 3)
    torch.manual_seed(0)
    out = transform_pair(image, mask, joint, image_transform(), pad)
    assert not v2_calls and type(out[0]) is tv_tensors.Image and type(out[1]) is tv_tensors.Mask
    out = transform_pair(image, mask, joint, lambda im: im.float(), pad)
    assert not v2_calls and out[0].dtype == torch.float32  # each LeanCompose is still lean on its own
    transform_pair(image, mask, joint, lambda im: im.float(), PadTo(48))
    assert v2_calls  # a bare v2 transform called as a stage goes through v2


def test_samples_do_not_depend_on_the_thread_count(shapes_root):
    ds = shapes(shapes_root, mode="train", base_size=40, crop_size=32, scale_range=(0.5, 2.0), jitter=0.4)
    threads = torch.get_num_threads()
    try:
        samples = []
        for n in (1, 2):
            torch.set_num_threads(n)
            torch.manual_seed(5)
            samples.append([ds[i] for i in range(len(ds))])
    finally:
        torch.set_num_threads(threads)
    for a, b in zip(*samples):
        assert_same(a, b)


def test_an_image_transform_that_changes_the_size_is_refused(shapes_root):
    """transform= runs on the image alone: a Resize in it returned an image and a mask of different sizes, scored
    without an error in val / testval."""
    ds = shapes(shapes_root, split="val", mode="testval", transform=v2.Compose([v2.Resize(20), v2.ToDtype(
        torch.float32, scale=True)]))
    with pytest.raises(ValueError, match=r"changed the image's size \(\d+, \d+\) to \(\d+, \d+\): it runs on the "
                                         r"image alone, so the mask no longer matches"):
        ds[0]
