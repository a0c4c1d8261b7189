"""Where an evaluation is wrong, image by image (``test.py --save-pred``): error maps and the worst images.

* :func:`error_kinds` / :func:`error_map`: every pixel correct, wrong or ignored (the target's ``ignore_index``),
  drawn over the image: the image and each kind's colour (:data:`ERROR_COLOURS`) averaged, ``(image + colour + 1)
  // 2`` per channel;
* :class:`ErrorMaps`: the ``on_outputs`` hook of :func:`~encoding.engine.evaluate_images` that writes, for each
  image, ``<stem>.png`` (the image beside its error map, a legend below) into a folder, scores each image (its own
  mIoU, :func:`image_miou`) and keeps small thumbnails of the ``worst`` lowest; :meth:`ErrorMaps.write_gallery`
  draws them, the lowest first, one row each: image | truth | prediction | errors. Under ``torch.distributed`` the
  ranks' worst images are gathered first (a collective: every rank calls it); :func:`error_maps_of` makes the one of
  ``test.py``'s job.

Only Pillow draws here (no matplotlib); every PNG is written atomically.
"""
from __future__ import annotations

import heapq
import os
from typing import Any, List, Optional, Sequence, Tuple

import numpy as np
import torch
from PIL import Image, ImageDraw, ImageFont
from torch import Tensor

from ..utils.dist import is_dist_avail_and_initialized
from ..utils.metrics import confusion_matrix, scores_from_confusion
from ..utils.palette import overlay
from .evaluation import EvaluationJob, background_ids, save_png
from .outputs import OutputClaims
from ..engine.loop import predicted_labels
from ..engine.previews import _displayable

__all__ = ["ERROR_COLOURS", "WORST_NAME", "WORST_COUNT", "error_kinds", "error_map", "error_panel", "image_miou",
           "ErrorMaps", "error_maps_of"]

#: The colour averaged with the image at each kind of pixel (index: :func:`error_kinds`' values 0, 1, 2).
ERROR_COLOURS = {"correct": (0, 200, 0), "wrong": (255, 0, 0), "ignored": (255, 255, 255)}
#: The gallery's file name (beside ``metrics.json``) and its default number of images.
WORST_NAME, WORST_COUNT = "worst_images.png", 8
_THUMB, _CAPTION, _LEGEND = 160, 14, 16


def error_kinds(labels: Any, target: Any, ignore_index: int = -1) -> np.ndarray:
    """``H x W`` ``uint8``: 0 where ``labels`` equal ``target``, 1 where they differ, 2 where the target is
    ``ignore_index`` (not scored)."""
    labels, target = np.asarray(labels), np.asarray(target)
    if labels.shape != target.shape:
        raise ValueError(f"prediction of shape {labels.shape} does not match target of shape {target.shape}")
    kinds = (labels != target).astype(np.uint8)
    kinds[target == ignore_index] = 2
    return kinds


def error_map(image: np.ndarray, labels: Any, target: Any, ignore_index: int = -1) -> np.ndarray:
    """``H x W x 3`` ``uint8``: at every pixel, ``(image + colour + 1) // 2`` with the colour of its kind
    (:data:`ERROR_COLOURS`: green correct, red wrong, white ignored).

    Args:
        image: ``H x W x 3`` ``uint8``.
        labels: ``H x W`` predicted class ids.
        target: ``H x W`` true class ids, ``ignore_index`` where not scored.
    """
    kinds = error_kinds(labels, target, ignore_index)
    colours = np.asarray(list(ERROR_COLOURS.values()), dtype=np.uint16)[kinds]
    return ((np.asarray(image, dtype=np.uint16) + colours + 1) >> 1).astype(np.uint8)


def _legend(width: int, text: str = "") -> Image.Image:
    strip = Image.new("RGB", (width, _LEGEND), (255, 255, 255))
    draw, font, x = ImageDraw.Draw(strip), ImageFont.load_default(), 2
    for name, colour in ERROR_COLOURS.items():
        draw.rectangle([x, 3, x + 9, 12], fill=colour, outline=(0, 0, 0))
        draw.text((x + 13, 2), name, fill=(0, 0, 0), font=font)
        x += 14 + int(draw.textlength(name, font=font)) + 8
    draw.text((x + 4, 2), text, fill=(0, 0, 0), font=font)
    return strip


def error_panel(image: np.ndarray, labels: Any, target: Any, ignore_index: int = -1, text: str = "") -> Image.Image:
    """The image (left) beside its :func:`error_map` (right), above a legend of the three colours and ``text``:
    ``2W x (H + 16)`` RGB."""
    height, width = np.asarray(image).shape[:2]
    panel = Image.new("RGB", (2 * width, height + _LEGEND), (255, 255, 255))
    panel.paste(Image.fromarray(np.asarray(image, dtype=np.uint8)), (0, 0))
    panel.paste(Image.fromarray(error_map(image, labels, target, ignore_index)), (width, 0))
    panel.paste(_legend(2 * width, text), (0, height))
    return panel


def image_miou(labels: Tensor, target: Tensor, nclass: int, ignore_index: int = -1) -> float:
    """The mIoU of one image (the classes in its target or its prediction; ``NaN`` when every pixel is ignored)."""
    return scores_from_confusion(confusion_matrix(labels, target, nclass, ignore_index))["mIoU"]


def _thumb(array: np.ndarray, nearest: bool = False) -> np.ndarray:
    height, width = array.shape[:2]
    size = (max(1, round(width * _THUMB / height)), _THUMB)
    return np.asarray(Image.fromarray(array).resize(size, Image.NEAREST if nearest else Image.BILINEAR))


class ErrorMaps:
    """The ``on_outputs`` hook of :func:`~encoding.engine.evaluate_images` that writes each image's error panel and
    keeps the worst images for :meth:`write_gallery`.

    Args:
        out_dir: where ``<stem>.png`` (:func:`error_panel`) goes for each input (created).
        nclass: the number of classes (the per-image mIoU).
        palette: the dataset's colours (the gallery's truth and prediction overlays).
        ignore_index: the target's unscored value.
        threshold: the foreground threshold of a one-channel (binary) output.
        worst: how many of the lowest-scoring images the gallery shows.
        unblended: class ids the gallery's overlays leave unblended (the ``background`` class: black in the VOC
            colours).
        claims: the files of the run, shared with its predictions' writer (default: this hook's own): a panel for
            a path claimed already is refused (:class:`~encoding.inference.evaluation.OutputClaims`), never
            written over another output.

    Attributes:
        scores: ``[(input name, its mIoU), ...]`` of every image this process scored, in order.
        written: the panels written.
    """

    def __init__(self, out_dir: str, nclass: int, palette: Any, ignore_index: int = -1, threshold: float = 0.5,
                 worst: int = WORST_COUNT, unblended: Sequence[int] = (),
                 claims: Optional[OutputClaims] = None) -> None:
        self.out_dir, self.nclass, self.palette, self.ignore_index = out_dir, nclass, palette, ignore_index
        self.threshold, self.worst, self.unblended = threshold, worst, tuple(unblended)
        self.claims = OutputClaims() if claims is None else claims
        self.scores: List[Tuple[str, float]] = []
        self.written: List[str] = []
        self._heap: List[Tuple[float, int, str, np.ndarray]] = []  # (-mIoU, order, name, row): the worst kept
        os.makedirs(out_dir, exist_ok=True)

    def __call__(self, outputs: Sequence[Tensor], batch: Sequence[Any]) -> None:
        if len(batch) < 3 or not isinstance(batch[1][0], Tensor):
            return  # no masks (the test split): nothing to compare with
        for labels, image, target, name in zip(predicted_labels(list(outputs), self.threshold), batch[0], batch[1],
                                               batch[-1]):
            self.add(name, _displayable(image), labels, target.cpu())

    def add(self, name: str, image: np.ndarray, labels: Tensor, target: Tensor) -> float:
        """Score one image, write its panel, keep it if among the worst; returns its mIoU.

        Raises:
            UsageError: the panel's file is claimed already (another output of the run: see ``claims``).
        """
        path = self.claims.claim(self.out_dir, name, "error map")
        miou = image_miou(labels, target, self.nclass, self.ignore_index)
        labels_np, target_np = labels.numpy(), target.numpy()
        panel = error_panel(image, labels_np, target_np, self.ignore_index, f"mIoU {miou:.4f}")
        save_png(panel, path)
        self.written.append(path)
        self.scores.append((name, miou))
        key = -miou if miou == miou else float("inf")  # an image with nothing scored is never among the worst
        if self.worst > 0 and key != float("inf") and (len(self._heap) < self.worst or key > self._heap[0][0]):
            row = self._row(image, labels_np, target_np)
            entry = (key, -len(self.scores), name, row)
            (heapq.heappush if len(self._heap) < self.worst else heapq.heapreplace)(self._heap, entry)
        return miou

    def _row(self, image: np.ndarray, labels: np.ndarray, target: np.ndarray) -> np.ndarray:
        truth, prediction = (np.asarray(overlay(image, ids, self.palette, unblended=self.unblended))
                             for ids in (target, labels))
        panels = [image, truth, prediction, error_map(image, labels, target, self.ignore_index)]
        return np.concatenate([_thumb(p, nearest=i > 0) for i, p in enumerate(panels)], axis=1)

    def worst_images(self) -> List[Tuple[str, float, np.ndarray]]:
        """``[(name, mIoU, thumbnail row), ...]`` of the ``worst`` lowest-scoring images of all processes, the lowest
        first (ties: the first scored first). A collective under ``torch.distributed``."""
        kept = list(self._heap)
        if is_dist_avail_and_initialized():
            gathered: List[Any] = [None] * torch.distributed.get_world_size()
            torch.distributed.all_gather_object(gathered, kept)
            kept = [entry for part in gathered for entry in part]
        kept.sort(key=lambda e: (-e[0], -e[1]))
        return [(name, -key, row) for key, _, name, row in kept[:self.worst]]

    def write_gallery(self, path: str, rows: Optional[List[Tuple[str, float, np.ndarray]]] = None) -> Optional[str]:
        """Draw ``rows`` (default :meth:`worst_images`) as one PNG at ``path``: per image a caption (name, mIoU)
        above image | truth | prediction | errors, 160 pixels high; ``None`` (nothing written) without
        scored images. Returns the path."""
        rows = self.worst_images() if rows is None else rows
        if not rows:
            return None
        width = max(row.shape[1] for _, _, row in rows)
        gallery = Image.new("RGB", (width, _LEGEND + len(rows) * (_CAPTION + _THUMB)), (255, 255, 255))
        gallery.paste(_legend(width, "columns: image | truth | prediction | errors"), (0, 0))
        draw, font = ImageDraw.Draw(gallery), ImageFont.load_default()
        for i, (name, miou, row) in enumerate(rows):
            top = _LEGEND + i * (_CAPTION + _THUMB)
            draw.text((2, top + 1), f"{i + 1}. {name}  mIoU {miou:.4f}", fill=(0, 0, 0), font=font)
            gallery.paste(Image.fromarray(row), (0, top + _CAPTION))
        save_png(gallery, path)
        return path


def error_maps_of(job: EvaluationJob) -> Optional[ErrorMaps]:
    """The :class:`ErrorMaps` of ``test.py``'s scored ``--save-pred`` run (into the writer's ``errors_dir``,
    ``<DIR>/errors/``; its files claimed with the predictions'), else ``None``."""
    if job.writer is None or job.writer.errors_dir is None:
        return None
    return ErrorMaps(job.writer.errors_dir, len(job.class_names), job.writer.dataset,
                     ignore_index=job.metric.ignore_index, threshold=job.metric.threshold,
                     unblended=background_ids(job.class_names), claims=job.writer.claims)
