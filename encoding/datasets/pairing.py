"""How a folder dataset's images meet their masks: by file name, with the mask suffixes people use, or by a list.

:func:`pair_folders` matches an image folder with a mask folder by relative stem (``sub/0001.jpg`` with
``sub/0001.png``), or, when the masks' stems carry one suffix that all of them share (``0001_mask.png``,
``_label``, ``_gt``, ``-seg``, ...), by the stem without it. Files left without a partner are returned as problems
for the scan's report (every one named); when nothing pairs at all it says how to name the files or to use
``splits/*.txt``, with an example. :func:`read_pair_list` reads such a list: one sample per line, a stem, or an
``image mask`` pair of paths relative to the root (a name may hold spaces: a line that names an existing file is
taken whole, and a tab separates a pair of such names); an entry with an extension names that very file.
"""
from __future__ import annotations

import os
import re
from typing import Dict, List, Tuple

from ..utils.images import image_extensions
from .folder_meta import CLASS_FILES
from .layout import DatasetError

__all__ = ["Pair", "Problem", "by_stem", "mask_suffix", "pair_folders", "read_pair_list"]

Pair = Tuple[str, str]
#: A file without a partner: ``("unpaired", path, detail)`` (the scan's :data:`~.scan.Problem`).
Problem = Tuple[str, str, str]
_SEPARATORS = "_-. "


def _image_exts() -> set:
    return image_extensions()


def by_stem(folder: str) -> Dict[str, str]:
    """Relative stem (``sub/name``) -> path of every image file under ``folder`` (hidden files skipped).

    Raises:
        DatasetError: two files with the same stem.
    """
    exts, found = _image_exts(), {}
    for base, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(files):
            stem, ext = os.path.splitext(name)
            if name.startswith(".") or name in CLASS_FILES or ext.lower() not in exts:
                continue
            key = os.path.relpath(os.path.join(base, stem), folder)
            if key in found:
                raise DatasetError(os.path.join(base, name), f"has the same stem as {found[key]}: one file per sample")
            found[key] = os.path.join(base, name)
    return found


def mask_suffix(images: Dict[str, str], masks: Dict[str, str]) -> str:
    """The suffix that every mask stem shares and that, taken off, names an image (``"_mask"``), or ``""``."""
    if not masks or any(stem in images for stem in masks):
        return ""
    reversed_stems = [stem[::-1] for stem in masks]
    common = os.path.commonprefix(reversed_stems)[::-1]
    for start in range(len(common)):  # the longest suffix that starts at a separator and pairs a mask
        suffix = common[start:]
        if suffix[0] in _SEPARATORS and any(stem[:-len(suffix)] in images for stem in masks):
            return suffix
    return ""


def _example(image_dir: str, images: Dict[str, str], masks: Dict[str, str]) -> str:
    image = os.path.basename(next(iter(images.values()))) if images else "0001.jpg"
    mask = os.path.basename(next(iter(masks.values()))) if masks else "0001.png"
    return (f"no mask name matches an image name in {image_dir} (e.g. {image} and {mask}): name each mask as its "
            f"image (0001.jpg + 0001.png) or with one suffix shared by all masks (0001_mask.png, _label, _gt), or "
            f"use splits/*.txt listing the pairs, one 'images/{image}<TAB>masks/{mask}' per line")


def pair_folders(image_dir: str, mask_dir: str) -> Tuple[List[Pair], List[Problem]]:
    """``(pairs, problems)`` of an image folder and a mask folder (see the module docstring).

    Raises:
        DatasetError: the mask folder is missing, the image folder is empty, or no file pairs at all.
    """
    if not os.path.isdir(mask_dir):
        raise DatasetError(mask_dir, f"mask folder is missing (the images are in {image_dir})")
    images, masks = by_stem(image_dir), by_stem(mask_dir)
    if not images:
        raise DatasetError(image_dir, "holds no image file")
    suffix = mask_suffix(images, masks)
    if suffix:
        masks = {stem[:-len(suffix)]: path for stem, path in masks.items()}
    pairs = [(images[k], masks[k]) for k in sorted(images) if k in masks]
    if not pairs:
        raise DatasetError(mask_dir, _example(image_dir, images, masks))
    problems = [("unpaired", images[k], f"image without a mask in {mask_dir}") for k in sorted(images)
                if k not in masks]
    problems += [("unpaired", masks[k], f"mask without an image in {image_dir}") for k in sorted(masks)
                 if k not in images]
    return pairs, problems


def _split_line(line: str, root: str, images: Dict[str, str]) -> List[str]:
    """A list line as ``[stem]`` or ``[image, mask]``: the whole line when it names a sample, else the split at a tab,
    else the split at the blank that leaves two existing files (names with spaces), else at the first blank."""
    if line in images or os.path.splitext(line)[0] in images or os.path.isfile(os.path.join(root, line)):
        return [line]
    if "\t" in line:
        return [p.strip() for p in line.split("\t", 1)]
    for blank in re.finditer(r"\s+", line):
        first, second = line[:blank.start()], line[blank.end():]
        if os.path.isfile(os.path.join(root, first)) and os.path.isfile(os.path.join(root, second)):
            return [first, second]
    return line.split(None, 1)


def _refuse_another_extension(split_file: str, number: int, entry: str, image: str, root: str) -> None:
    """An entry that names a file (``0001.jpg``) means that file, never another of its stem (``0001.png``).

    Raises:
        DatasetError: naming the list, the line and the file that exists.
    """
    named, found = os.path.splitext(entry)[1], os.path.splitext(image)[1]
    if named.lower() != found.lower():
        raise DatasetError(split_file, f"line {number} lists {entry!r}, which does not exist; the image of that stem "
                           f"is {os.path.relpath(image, root)!r}: list that file, or the stem alone")


def read_pair_list(root: str, split_file: str) -> List[Pair]:
    """The pairs of a list file: stems over ``images/`` + ``masks/``, or ``image mask`` relative paths. An entry with
    an extension (``0001.jpg``, ``images/0001.jpg``) names that image file; a stem (``0001``) takes the one image of
    that stem.

    Raises:
        DatasetError: an entry without its files, an entry naming an image file whose stem exists only with another
            extension (one line naming the list, the line and the file that exists), a file that is not UTF-8 text,
            or an empty list.
    """
    images, masks = by_stem(os.path.join(root, "images")), by_stem(os.path.join(root, "masks"))
    suffix = mask_suffix(images, masks)
    masks = {stem[:-len(suffix)]: p for stem, p in masks.items()} if suffix else masks
    try:
        with open(split_file, encoding="utf-8") as f:
            lines = [line.rstrip("\r\n").strip() for line in f]
    except UnicodeDecodeError:
        raise DatasetError(split_file, "is not UTF-8 text: save the list as UTF-8") from None
    pairs = []
    for number, line in enumerate(lines, start=1):
        if not line or line.startswith("#"):
            continue
        parts = _split_line(line, root, images)
        if len(parts) >= 2:
            pairs.append((os.path.join(root, parts[0]), os.path.join(root, parts[1])))
            continue
        stem = parts[0] if parts[0] in images else os.path.splitext(parts[0])[0]
        if stem not in images and stem.startswith("images" + os.sep):  # an image path: images/0001.jpg
            stem = stem[len("images" + os.sep):]
        if stem not in images or stem not in masks:
            side = "an image in images/" if stem not in images else "a mask in masks/"
            raise DatasetError(split_file, f"lists {parts[0]!r}, which has no {side}")
        if parts[0] not in images:
            _refuse_another_extension(split_file, number, parts[0], images[stem], root)
        pairs.append((images[stem], masks[stem]))
    for image, mask in pairs:
        for path, kind in ((image, "image"), (mask, "mask")):
            if not os.path.isfile(path):
                raise DatasetError(path, f"{kind} file is missing (listed in {split_file})")
    if not pairs:
        raise DatasetError(split_file, "split file is empty")
    return pairs
