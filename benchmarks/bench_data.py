"""Train-mode data loading throughput: ``encoding.datasets`` vs a plain torchvision v2 pipeline doing the same ops.

Both read the same VOC-layout files (JPEG images of 500x375 / 375x500 + PNG masks, written once to a temporary folder)
through a ``DataLoader`` with one worker, and do: random horizontal flip, long side resized to a random size in
``[0.5, 2.0] * 520``, normalisation with the ImageNet mean/std, a 480x480 random crop padded with 0 (image) / ignore
(mask), and masks as ``int64`` with -1 = ignore. Ours also validates every mask (label range, size) on the way.

Prints samples/s for each and the ratio (goal: ours / plain >= 0.95).

    python benchmarks/bench_data.py [--samples 240] [--repeats 3]
"""
import argparse
import os
import sys
import tempfile
import time

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset
from torchvision import tv_tensors
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from encoding.datasets import IMAGENET_MEAN, IMAGENET_STD, VOCSegmentation  # noqa: E402
from encoding.datasets.prepare.shapes_render import render_scene  # noqa: E402

BASE, CROP = 520, 480


def write_voc(root: str, count: int) -> None:
    """``count`` natural-looking scenes in the VOC 2012 layout (labels 0..6 and 255)."""
    base = os.path.join(root, "VOCdevkit", "VOC2012")
    for sub in ("JPEGImages", "SegmentationClass", os.path.join("ImageSets", "Segmentation")):
        os.makedirs(os.path.join(base, sub), exist_ok=True)
    ids = []
    for i in range(count):
        size = (375, 500) if i % 3 else (500, 375)
        image, label = render_scene(np.random.default_rng(i), *size)
        name = f"bench_{i:04d}"
        Image.fromarray(image).save(os.path.join(base, "JPEGImages", name + ".jpg"), quality=90)
        Image.fromarray(label).save(os.path.join(base, "SegmentationClass", name + ".png"))
        ids.append(name)
    with open(os.path.join(base, "ImageSets", "Segmentation", "train.txt"), "w") as f:
        f.write("\n".join(ids) + "\n")


class PlainV2(Dataset):
    """The same operations written directly with torchvision v2 (no validation, no label mapping)."""

    def __init__(self, root: str) -> None:
        base = os.path.join(root, "VOCdevkit", "VOC2012")
        with open(os.path.join(base, "ImageSets", "Segmentation", "train.txt")) as f:
            ids = f.read().split()
        self.images = [os.path.join(base, "JPEGImages", i + ".jpg") for i in ids]
        self.masks = [os.path.join(base, "SegmentationClass", i + ".png") for i in ids]
        self.flip = v2.RandomHorizontalFlip()
        self.post = v2.Compose([
            v2.ToDtype(torch.float32, scale=True),
            v2.Normalize(list(IMAGENET_MEAN), list(IMAGENET_STD)),
            v2.RandomCrop(CROP, pad_if_needed=True, fill={tv_tensors.Image: 0.0, tv_tensors.Mask: 255}),
        ])

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int):
        image = v2.functional.pil_to_tensor(Image.open(self.images[index]).convert("RGB"))
        image = tv_tensors.Image(image)
        mask = tv_tensors.Mask(torch.from_numpy(np.array(Image.open(self.masks[index]))))
        image, mask = self.flip(image, mask)
        long_side = int(torch.randint(BASE // 2, BASE * 2 + 1, ()).item())
        h, w = image.shape[-2:]
        size = [long_side, int(w * long_side / h + 0.5)] if h >= w else [int(h * long_side / w + 0.5), long_side]
        image, mask = F.resize(image, size, antialias=True), F.resize(mask, size)
        image, mask = self.post(image, mask)
        mask = mask.as_subclass(torch.Tensor).to(torch.int64)
        mask[mask == 255] = -1
        return image.as_subclass(torch.Tensor), mask


class Cycled(Dataset):
    """Repeat a small dataset to ``length`` samples."""

    def __init__(self, dataset: Dataset, length: int) -> None:
        self.dataset, self.length = dataset, length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int):
        return self.dataset[index % len(self.dataset)]


def samples_per_second(dataset: Dataset, samples: int, batch_size: int = 4) -> float:
    loader = DataLoader(Cycled(dataset, samples + 4 * batch_size), batch_size=batch_size, num_workers=1,
                        generator=torch.Generator().manual_seed(0))
    it = iter(loader)
    for _ in range(4):  # warm-up: worker start, first decodes
        next(it)
    start, seen = time.perf_counter(), 0
    for images, masks in it:
        assert images.shape[-2:] == (CROP, CROP) and masks.dtype == torch.int64
        seen += images.shape[0]
    return seen / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=240, help="samples timed per run")
    parser.add_argument("--repeats", type=int, default=3, help="runs per pipeline (alternating); the median counts")
    parser.add_argument("--images", type=int, default=24, help="distinct files on disk")
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as root:
        write_voc(root, args.images)
        ours = VOCSegmentation(root, split="train", base_size=BASE, crop_size=CROP)
        plain = PlainV2(root)
        results = {"encoding.datasets": [], "plain torchvision v2": []}
        for _ in range(args.repeats):
            results["encoding.datasets"].append(samples_per_second(ours, args.samples))
            results["plain torchvision v2"].append(samples_per_second(plain, args.samples))
    medians = {name: float(np.median(values)) for name, values in results.items()}
    print(f"train mode, crop {CROP}, base {BASE}, one DataLoader worker, {args.samples} samples x {args.repeats} runs")
    for name, value in medians.items():
        runs = ", ".join(f"{v:.1f}" for v in results[name])
        print(f"  {name:22s} {value:7.1f} samples/s  (runs: {runs})")
    print(f"ratio ours / plain = {medians['encoding.datasets'] / medians['plain torchvision v2']:.3f}  (goal >= 0.95)")


if __name__ == "__main__":
    main()
