"""PASCAL-Context's ``trainval_merged.json`` (PASCAL-in-Detail format) converted once into label PNGs.

The RLE masks are decoded by ``pycocotools`` (the ``prepare`` extra) into the 60-value form ``0 = background /
other, 1..59 = classes`` that :class:`~encoding.datasets.ContextSegmentation` reads. The conversion follows the
Detail API's semantic mask: per image, segmentation annotations are painted in file order, later ones over earlier
ones, each with its category id; category ids outside the 59 classes become 0.
"""
from __future__ import annotations

import json
import os
import warnings
from collections import Counter, defaultdict
from typing import Any, Dict, List, Mapping, Tuple

import numpy as np
from PIL import Image
from ...errors import MissingDependency
from ...utils.progress import progress_bar as tqdm

from ..layout import CONTEXT_CATEGORY_IDS, CONTEXT_LIST_DIR, CONTEXT_MASK_DIR, DatasetError
from .annotations import check_rle_size, converted, image_shape, mask_stem, staged_conversion

__all__ = ["decode_rle", "convert_context_annotations"]


def _mask_api() -> Any:
    """``pycocotools.mask`` (the ``prepare`` extra), with a clear error when it is missing."""
    try:
        from pycocotools import mask
    except ImportError as e:
        raise MissingDependency("converting PASCAL-Context's annotations needs pycocotools: pip install "
                                "pycocotools (or the 'prepare' extra); only once: the masks are then saved as PNGs "
                                "and read without it") from e
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


def _category(ann: Mapping[str, Any]) -> int:
    """An annotation's category id, a whole number >= 0 (a negative one would index the lookup from its end)."""
    category = ann["category_id"]
    if type(category) is not int or category < 0:
        raise ValueError(f"annotation {ann.get('id')} has category_id {category!r}, expected a whole number >= 0")
    return category


def _context_mask(image: Mapping[str, Any], annotations: List[Mapping[str, Any]], lookup: np.ndarray,
                  json_path: str) -> np.ndarray:
    category = np.zeros(image_shape(image, json_path), dtype=np.int64)
    for ann in annotations:
        check_rle_size(ann, category.shape)
        category[decode_rle(ann["segmentation"])] = _category(ann)
    inside = category < len(lookup)
    return np.where(inside, lookup[np.where(inside, category, 0)], 0).astype(np.uint8)


def _count_ids(path: str) -> int:
    if not os.path.isfile(path):
        return 0
    with open(path, encoding="utf-8") as f:
        return sum(1 for line in f if line.strip())


def _read_detail(json_path: str) -> Tuple[List[Mapping[str, Any]], Dict[Any, List[Mapping[str, Any]]]]:
    """The image records of a PASCAL-in-Detail file and its segmentation annotations grouped by image id."""
    try:
        with open(json_path, encoding="utf-8") as f:
            data = json.load(f)
        images = [dict(image) for image in data["images"]]
        by_image: Dict[Any, List[Mapping[str, Any]]] = defaultdict(list)
        for ann in data["annos_segmentation"]:
            by_image[ann["image_id"]].append(ann)
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise DatasetError(json_path, f"not a PASCAL-in-Detail annotation file ({e!r})") from e
    return images, by_image


def _split_phases(images: List[Mapping[str, Any]], json_path: str) -> Tuple[List[Mapping[str, Any]], Dict[str, int]]:
    """The images of phase ``train`` or ``val`` (the two lists, as the Detail API's ``Detail(..., phase)`` that
    PyTorch-Encoding reads them with) and the number left out per other phase (``test``...).

    Raises:
        DatasetError: naming ``json_path``: an image without a ``phase`` (its split cannot be told).
    """
    kept, left_out = [], Counter()
    for image in images:
        if "phase" not in image:
            raise DatasetError(json_path, f"image {image.get('file_name')!r} has no 'phase' (expected 'train' or "
                                          "'val'; its split cannot be told)")
        if image["phase"] in ("train", "val"):
            kept.append(image)
        else:
            left_out[str(image["phase"])] += 1
    return kept, dict(left_out)


def convert_context_annotations(json_path: str, voc_root: str, *, overwrite: bool = False,
                                progress: bool = True) -> Dict[str, int]:
    """Convert ``trainval_merged.json`` into label PNGs and split lists under ``voc_root`` (``VOCdevkit/VOC2010``).

    Writes ``SegmentationClassContext/<id>.png`` and ``ImageSets/SegmentationContext/{train,val}.txt`` as one unit
    (:func:`~.annotations.staged_conversion`: masks staged and renamed into place, then the lists, then a marker). A
    complete conversion (its marker there) is kept unless ``overwrite``; an interrupted one is done again.

    Only the images of phase ``train`` and ``val`` are converted and listed, as the Detail API reads them; the
    number of those of another phase (``test``...) is printed in one line.

    Returns:
        Number of images per list, e.g. ``{"train": 4998, "val": 5105}``.

    Raises:
        DatasetError: naming ``json_path``: not a PASCAL-in-Detail file, an image without a ``phase``, an image
            whose ``file_name`` is not a plain file name or whose size is not usable (:mod:`.annotations`), a
            negative category id, an annotation of another size than its image.
    """
    mask_dir, list_dir = os.path.join(voc_root, CONTEXT_MASK_DIR), os.path.join(voc_root, CONTEXT_LIST_DIR)
    list_files = {p: os.path.join(list_dir, p + ".txt") for p in ("train", "val")}
    if not overwrite and converted(mask_dir, list(list_files.values())):
        return {p: _count_ids(path) for p, path in list_files.items()}
    images, by_image = _read_detail(json_path)
    images, left_out = _split_phases(images, json_path)
    lookup = _category_lookup()
    phases: Dict[str, List[str]] = defaultdict(list)
    with staged_conversion(mask_dir) as (staging, lists):
        for image in tqdm(images, desc="PASCAL-Context masks", disable=not progress):
            stem = mask_stem(image.get("file_name"), json_path)
            try:
                mask = _context_mask(image, by_image.get(image.get("image_id"), []), lookup, json_path)
            except DatasetError:
                raise
            except (ValueError, KeyError, TypeError) as e:
                raise DatasetError(json_path, f"bad annotation for {image.get('file_name')}: {e}") from e
            Image.fromarray(mask).save(os.path.join(staging, stem + ".png"))
            phases[image["phase"]].append(stem)
        for phase, path in list_files.items():
            lists[path] = "".join(stem + "\n" for stem in sorted(phases.get(phase, [])))
    if left_out:
        print(f"PASCAL-Context: left out {sum(left_out.values())} image(s) of another phase than train / val ("
              + ", ".join(f"{phase!r}: {n}" for phase, n in sorted(left_out.items())) + ")", flush=True)
    return {p: len(phases.get(p, [])) for p in list_files}
