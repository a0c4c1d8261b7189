"""What ``demo.py`` does with its images: where each one's outputs go, and one image at a time through the network.

* :func:`expand_images`: the images the arguments name, as users type them: files, folders (every image in it,
  sorted) and quoted globs (``"photos/*.jpg"``);
* :func:`demo_outputs`: the ``(mask, overlay)`` PNGs of each input, never colliding, never silently replacing a file;
* :func:`segment_files`: read (decode once), segment and write one image at a time (the memory does not grow with
  their number);
* :func:`write_pngs`: several PNGs all or nothing (atomic files; a failure leaves none of them).
"""
from __future__ import annotations

import glob
import io
import os
from typing import Iterator, List, Sequence, Tuple

import torch
from PIL import Image
from torch import nn

from ..datasets.layout import DatasetError
from ..errors import UsageError
from ..utils.files import atomic_write, refuse_own_input
from ..utils.images import image_extensions
from ..utils.palette import colorize
from ..datasets.transforms import denormalize
from .evaluation import overlay_with_legend, read_image
from .loading import ModelInfo
from .predict import segment

__all__ = ["expand_images", "demo_outputs", "segment_files", "write_pngs"]


def _folder_images(folder: str) -> List[str]:
    """The image files directly in ``folder`` (the formats :func:`~encoding.utils.images.open_image` reads; hidden
    files skipped), sorted by name."""
    extensions = image_extensions()
    names = sorted(name for name in os.listdir(folder) if not name.startswith(".")
                   and os.path.splitext(name)[1].lower() in extensions
                   and os.path.isfile(os.path.join(folder, name)))
    return [os.path.join(folder, name) for name in names]


def expand_images(arguments: Sequence[str]) -> List[str]:
    """The image files that ``demo.py``'s arguments name, in order: a file as it is (checked later, when it is
    read), a folder as every image in it (sorted by name; not its sub-folders), and a glob that the shell did not
    expand (``"photos/*.jpg"``, ``photos/**/*.png``) as the files it matches (sorted).

    Raises:
        UsageError: a folder holding no image, or a glob matching no file (the message names it).
    """
    images: List[str] = []
    for argument in arguments:
        if os.path.isdir(argument):
            found = _folder_images(argument)
            if not found:
                raise UsageError(f"{argument}: the folder holds no image file (any format PIL reads)")
        elif not os.path.exists(argument) and glob.has_magic(argument):
            found = sorted(p for p in glob.glob(argument, recursive=True) if os.path.isfile(p))
            if not found:
                raise UsageError(f"{argument}: no file matches this pattern")
        else:
            found = [argument]
        images.extend(found)
    return images


def demo_outputs(paths: Sequence[str], out_dir: str, overwrite: bool = False) -> List[Tuple[str, str]]:
    """The ``(mask, overlay)`` PNGs of each input of ``demo.py``: ``<stem>_mask.png`` / ``<stem>_overlay.png`` in
    ``out_dir``; inputs whose names collide (``a/x.png b/x.png``, ``x.png x.jpg``) keep their folders relative to the
    inputs' common folder, and their extension if they still collide, so that no output overwrites another.

    Raises:
        UsageError: an input given twice (a ``ValueError``); ``out_dir`` is a file; an output is an input (even
            with ``overwrite``).
        UsageError: an output exists (unless ``overwrite``); the message names it (exit status 2, a refusal before
            any work, as ``train.py``'s of a run directory that holds a run).
    """
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise UsageError(f"--out-dir {out_dir}: that is a file; give a folder (created when missing)")
    absolute = [os.path.abspath(p) for p in paths]
    for i, path in enumerate(absolute):
        if path in absolute[:i]:
            raise UsageError(f"image given twice: {paths[i]}")
    stems = [os.path.splitext(os.path.basename(p))[0] for p in absolute]
    common = os.path.commonpath([os.path.dirname(p) for p in absolute]) if absolute else ""
    names = [os.path.join(os.path.relpath(os.path.dirname(p), common), stem) if stems.count(stem) > 1 else stem
             for p, stem in zip(absolute, stems)]
    names = [name + "_" + os.path.splitext(p)[1].lstrip(".") if names.count(name) > 1 else name
             for p, name in zip(absolute, names)]
    outputs = [tuple(os.path.normpath(os.path.join(out_dir, f"{name}_{kind}.png")) for kind in ("mask", "overlay"))
               for name in names]
    refuse_own_input([path for pair in outputs for path in pair], list(paths), "--out-dir")  # even with --overwrite
    existing = [path for pair in outputs for path in pair if os.path.exists(path)]
    if existing and not overwrite:
        raise UsageError(f"{existing[0]} exists ({len(existing)} of the outputs do): pass --overwrite to replace "
                         "them, or another --out-dir")
    return outputs


def write_pngs(files: Sequence[Tuple[str, Image.Image]]) -> None:
    """Write several PNGs all or nothing: every image is encoded before any is written, each file atomically, and
    the files already written are removed when a later one fails."""
    encoded = []
    for path, image in files:
        buffer = io.BytesIO()
        image.save(buffer, format="PNG")
        encoded.append((path, buffer.getvalue()))
    done: List[str] = []
    try:
        for path, data in encoded:
            os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
            done.append(atomic_write(path, data))
    except BaseException:
        for path in done:
            os.remove(path)
        raise


def segment_files(model: nn.Module, paths: Sequence[str], outputs: Sequence[Tuple[str, str]], dataset: str,
                  device: torch.device, alpha: float = 0.5, blend_background: bool = False) -> Iterator[List[str]]:
    """Segment the images one at a time (memory independent of their number) and write each one's mask and
    overlay (:func:`write_pngs`); yields the names of the classes present in each image after writing it. The
    class names and colours are the model's (:class:`~.loading.ModelInfo`, from its checkpoint), else
    ``dataset``'s.

    Raises:
        DatasetError: an image cannot be decoded (its header was checked before, by ``demo.py``); the message names
            it and says how many images before it are written.
    """
    info = getattr(model, "info", None)
    if info is None:
        info = ModelInfo.of_dataset(dataset)
    class_names, palette = list(info.classes), info.palette
    for done, (path, (mask_path, overlay_path)) in enumerate(zip(paths, outputs)):
        try:
            image = read_image(path)
        except DatasetError as err:  # a header read well, but not the pixels: the images before keep their outputs
            raise DatasetError(err.path, f"{err.problem}; stopped there, the {done} image(s) before it are "
                               "written (rerun the others into another --out-dir, or pass --overwrite)") from err
        labels = segment(model, image, device=device)
        picture = overlay_with_legend(denormalize(image), labels, palette, class_names, alpha, blend_background)
        del image
        write_pngs([(mask_path, colorize(labels, palette)), (overlay_path, picture)])
        yield [class_names[c] for c in labels.unique().tolist()]
