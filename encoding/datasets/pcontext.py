"""PASCAL-Context, 59 classes (PyTorch-Encoding's ``pcontext``): VOC 2010 images + ``trainval_merged.json``.

The annotation JSON (PASCAL-in-Detail format) is converted once at prepare time, by
:func:`convert_context_annotations` (RLE masks decoded by ``pycocotools``, the ``prepare`` extra), into
label PNGs in the 60-value form ``0 = background / other, 1..59 = classes``; the dataset then reads PNGs like every
other dataset and ignores 0 (``k`` becomes class ``k - 1``). The conversion follows the Detail API's semantic mask:
per image, segmentation annotations are painted in file order, later ones over earlier ones, each with its category
id; category ids outside the 59 classes become 0.
"""
from __future__ import annotations

import json
import os
import warnings
from collections import defaultdict
from typing import Any, Dict, List, Mapping, Optional, Tuple

import numpy as np
from PIL import Image
from tqdm.auto import tqdm

from .base import BaseDataset, DatasetError, ShiftedLabels, default_root
from .pascal_voc import list_split
from .resources import Resource, fetch_resources
from ..utils.files import atomic_write, extract, staged_dir
from ..utils.palette import voc_palette

__all__ = ["ContextSegmentation", "CONTEXT_CLASSES", "CONTEXT_CATEGORY_IDS", "decode_rle",
           "convert_context_annotations", "prepare_pcontext"]

CONTEXT_CLASSES = (
    "aeroplane", "bag", "bed", "bedclothes", "bench", "bicycle", "bird", "boat", "book", "bottle", "building", "bus",
    "cabinet", "car", "cat", "ceiling", "chair", "cloth", "computer", "cow", "cup", "curtain", "dog", "door", "fence",
    "floor", "flower", "food", "grass", "ground", "horse", "keyboard", "light", "motorbike", "mountain", "mouse",
    "person", "plate", "platform", "pottedplant", "road", "rock", "sheep", "shelves", "sidewalk", "sign", "sky",
    "snow", "sofa", "table", "track", "train", "tree", "truck", "tvmonitor", "wall", "water", "window", "wood",
)
#: PASCAL-Context (459-label) category ids of the 59 classes, in class order (ascending id).
CONTEXT_CATEGORY_IDS = (
    2, 9, 18, 19, 22, 23, 25, 31, 33, 34, 44, 45, 46, 59, 65, 68, 72, 80, 85, 98, 104, 105, 113, 115, 144, 158, 159,
    162, 187, 189, 207, 220, 232, 258, 259, 260, 284, 295, 296, 308, 324, 326, 347, 349, 354, 355, 360, 366, 368,
    397, 415, 416, 420, 424, 427, 440, 445, 454, 458,
)

RESOURCES = {
    "voc2010": Resource("http://host.robots.ox.ac.uk/pascal/VOC/voc2010/VOCtrainval_03-May-2010.tar",
                        "md5:da459979d0c395079b5c75ee67908abb"),
    "annotations": Resource("https://codalabuser.blob.core.windows.net/public/trainval_merged.json",
                            "md5:3c2d0c0656b7be9eb61928ffe885d8ce"),
}
BASE_DIR = os.path.join("VOCdevkit", "VOC2010")
MASK_DIR = "SegmentationClassContext"
LIST_DIR = os.path.join("ImageSets", "SegmentationContext")


class ContextSegmentation(ShiftedLabels, BaseDataset):
    """PASCAL-Context with the usual 59 classes (background / other ignored).

    Layout under the data root (``scripts/prepare_pcontext.py`` builds the last two from the JSON)::

        VOCdevkit/VOC2010/JPEGImages/<id>.jpg
        VOCdevkit/VOC2010/SegmentationClassContext/<id>.png          # 0 = other, 1..59 = classes
        VOCdevkit/VOC2010/ImageSets/SegmentationContext/{train,val}.txt

    See :class:`BaseDataset` for the arguments.
    """

    NAME = "pcontext"
    NUM_CLASS = 59
    CLASSES = CONTEXT_CLASSES
    PALETTE = voc_palette()[:len(CONTEXT_CLASSES)]  # the VOC colour map, as in PyTorch-Encoding
    IGNORE_COLOR = voc_palette()[255]
    SPLITS = ("train", "val")
    BASE_DIR = BASE_DIR

    def _check_root(self) -> None:
        super()._check_root()
        if not os.path.isdir(os.path.join(self.dataset_dir, MASK_DIR)):
            raise DatasetError(os.path.join(self.dataset_dir, MASK_DIR),
                               "converted PASCAL-Context masks not found; run scripts/prepare_pcontext.py "
                               "(it converts trainval_merged.json)")

    def _find_samples(self) -> Tuple[List[str], Optional[List[str]]]:
        base = self.dataset_dir
        return list_split(os.path.join(base, LIST_DIR, self.split + ".txt"), os.path.join(base, "JPEGImages"),
                          ".jpg", os.path.join(base, MASK_DIR), ".png")


def _mask_api() -> Any:
    """``pycocotools.mask`` (the ``prepare`` extra), with a clear error when it is missing."""
    try:
        from pycocotools import mask
    except ImportError as e:
        raise ImportError("converting PASCAL-Context's annotations needs pycocotools: pip install pycocotools (or "
                          "the 'prepare' extra); only once: the masks are then saved as PNGs and read without it") from e
    return mask


def decode_rle(segmentation: Mapping[str, Any]) -> np.ndarray:
    """Decode a COCO-style run-length encoded mask ``{"size": [h, w], "counts": str | list}`` into a bool array.

    Decoded by ``pycocotools.mask``: runs alternate background / foreground starting with background, in
    column-major order; ``counts`` is the compressed string of the JSON files or a list of run lengths.

    Raises:
        ValueError: the runs do not cover ``h x w`` pixels.
    """
    height, width = (int(v) for v in segmentation["size"])
    counts = segmentation["counts"]
    api = _mask_api()
    if isinstance(counts, (str, bytes)):
        rle = {"size": [height, width], "counts": counts.encode("ascii") if isinstance(counts, str) else counts}
    else:
        runs = [int(c) for c in counts]
        if sum(runs) != height * width:
            raise ValueError(f"RLE covers {sum(runs)} pixels, expected {height}x{width}")
        rle = api.frPyObjects({"size": [height, width], "counts": runs}, height, width)
    with warnings.catch_warnings():  # pycocotools' numpy-2 "__array__ ... copy keyword" notice, not ours
        warnings.filterwarnings("ignore", message=".*copy keyword", category=DeprecationWarning)
        return api.decode(rle).astype(bool)


def _category_lookup() -> np.ndarray:
    lookup = np.zeros(max(CONTEXT_CATEGORY_IDS) + 1, dtype=np.uint8)
    lookup[list(CONTEXT_CATEGORY_IDS)] = np.arange(1, len(CONTEXT_CATEGORY_IDS) + 1)
    return lookup


def _context_mask(image: Mapping[str, Any], annotations: List[Mapping[str, Any]], lookup: np.ndarray) -> np.ndarray:
    category = np.zeros((int(image["height"]), int(image["width"])), dtype=np.int64)
    for ann in annotations:
        region = decode_rle(ann["segmentation"])
        if region.shape != category.shape:
            raise ValueError(f"annotation {ann.get('id')} of image {image['file_name']} has size {region.shape}, "
                             f"image is {category.shape}")
        category[region] = int(ann["category_id"])
    inside = category < len(lookup)
    return np.where(inside, lookup[np.where(inside, category, 0)], 0).astype(np.uint8)


def _count_ids(path: str) -> int:
    if not os.path.isfile(path):
        return 0
    with open(path, encoding="utf-8") as f:
        return sum(1 for line in f if line.strip())


def convert_context_annotations(json_path: str, voc_root: str, *, overwrite: bool = False,
                                progress: bool = True) -> Dict[str, int]:
    """Convert ``trainval_merged.json`` into label PNGs and split lists under ``voc_root`` (``VOCdevkit/VOC2010``).

    Writes ``SegmentationClassContext/<id>.png`` and ``ImageSets/SegmentationContext/{train,val}.txt``, all or
    nothing (the masks are built in a staging folder and renamed into place). An existing conversion is kept
    unless ``overwrite``.

    Returns:
        Number of images per phase, e.g. ``{"train": 4998, "val": 5105}``.
    """
    mask_dir, list_dir = os.path.join(voc_root, MASK_DIR), os.path.join(voc_root, LIST_DIR)
    if not overwrite and os.path.isdir(mask_dir) and os.path.isfile(os.path.join(list_dir, "val.txt")):
        return {p: _count_ids(os.path.join(list_dir, p + ".txt")) for p in ("train", "val")}
    try:
        with open(json_path, encoding="utf-8") as f:
            data = json.load(f)
        images = data["images"]
        annotations = data["annos_segmentation"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise DatasetError(json_path, f"not a PASCAL-in-Detail annotation file ({e!r})") from e
    by_image: Dict[Any, List[Mapping[str, Any]]] = defaultdict(list)
    for ann in annotations:
        by_image[ann["image_id"]].append(ann)
    lookup = _category_lookup()
    phases: Dict[str, List[str]] = defaultdict(list)
    with staged_dir(mask_dir, replace=True) as staging:
        for image in tqdm(images, desc="PASCAL-Context masks", disable=not progress):
            stem = os.path.splitext(image["file_name"])[0]
            try:
                mask = _context_mask(image, by_image.get(image["image_id"], []), lookup)
            except (ValueError, KeyError) as e:
                raise DatasetError(json_path, f"bad annotation for {image.get('file_name')}: {e}") from e
            Image.fromarray(mask).save(os.path.join(staging, stem + ".png"))
            phases[image.get("phase", "train")].append(stem)
        os.makedirs(list_dir, exist_ok=True)
        for phase in ("train", "val"):
            stems = sorted(phases.get(phase, []))
            atomic_write(os.path.join(list_dir, phase + ".txt"), "".join(stem + "\n" for stem in stems))
    return {p: len(v) for p, v in phases.items()}


def prepare_pcontext(root: Optional[str] = None, *, download_dir: Optional[str] = None,
                     mirror: Optional[str] = None, checksums: Optional[Mapping[str, Optional[str]]] = None,
                     overwrite: bool = False, progress: bool = True) -> str:
    """Download VOC 2010 and ``trainval_merged.json``, extract, and convert the annotations to label PNGs.

    Args:
        root: data root (default :func:`default_root`).
        download_dir: where the downloads are kept (default ``<root>/downloads``).
        mirror, checksums, overwrite, progress: see :func:`fetch_resources`.

    Returns:
        The dataset folder ``<root>/VOCdevkit/VOC2010``.
    """
    root = os.path.expanduser(root or default_root())
    tar, annotations = fetch_resources([RESOURCES["voc2010"], RESOURCES["annotations"]],
                                       download_dir or os.path.join(root, "downloads"), mirror=mirror,
                                       checksums=checksums, overwrite=overwrite, progress=progress)
    extract(tar, root, overwrite=overwrite, progress=progress)
    voc_root = os.path.join(root, BASE_DIR)
    if not os.path.isdir(os.path.join(voc_root, "JPEGImages")):
        raise DatasetError(os.path.join(voc_root, "JPEGImages"), "missing after extraction; is the archive right?")
    convert_context_annotations(annotations, voc_root, overwrite=overwrite, progress=progress)
    return voc_root
