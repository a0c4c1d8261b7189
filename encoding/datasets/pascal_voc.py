"""PASCAL VOC 2012 segmentation (21 classes, 255 = ignore) and the ``prepare_pascal`` step (VOC 2012 + SBD aug)."""
from __future__ import annotations

import os
from typing import List, Mapping, Optional, Tuple

from .base import BaseDataset, DatasetError, default_root, read_split_file
from .resources import Resource, fetch_resources
from ..utils.files import atomic_write, extract
from ..utils.palette import voc_palette

__all__ = ["VOCSegmentation", "VOC_CLASSES", "VOC_PALETTE", "VOC_IGNORE_COLOR", "prepare_pascal",
           "list_split"]

VOC_CLASSES = (
    "background", "aeroplane", "bicycle", "bird", "boat", "bottle", "bus", "car", "cat", "chair", "cow",
    "diningtable", "dog", "horse", "motorbike", "person", "pottedplant", "sheep", "sofa", "train", "tvmonitor",
)
#: The PASCAL VOC colour map of the 21 classes; ignored pixels take VOC's own "void" colour (entry 255).
VOC_PALETTE = voc_palette()[:len(VOC_CLASSES)]
VOC_IGNORE_COLOR = voc_palette()[255]

RESOURCES = {
    "voc2012": Resource("http://host.robots.ox.ac.uk/pascal/VOC/voc2012/VOCtrainval_11-May-2012.tar",
                        "md5:6cd6e144f989b92b3379bac3b3de84fd"),
    "sbd": Resource("http://www.eecs.berkeley.edu/Research/Projects/CS/vision/grouping/semantic_contours/"
                    "benchmark.tgz", "md5:82b4d87ceb2ed10f6038a1cba92111cb"),
}


def list_split(split_file: str, image_dir: str, image_ext: str, mask_dir: Optional[str],
               mask_ext: str) -> Tuple[List[str], Optional[List[str]]]:
    """Image and mask paths for the ids of a split file (``mask_dir=None``: images only)."""
    ids = read_split_file(split_file)
    images = [os.path.join(image_dir, i + image_ext) for i in ids]
    masks = None if mask_dir is None else [os.path.join(mask_dir, i + mask_ext) for i in ids]
    return images, masks


class VOCSegmentation(BaseDataset):
    """PASCAL VOC 2012 semantic segmentation.

    Layout under the data root::

        VOCdevkit/VOC2012/JPEGImages/<id>.jpg
        VOCdevkit/VOC2012/SegmentationClass/<id>.png        # palette PNG, 0..20, 255 = boundary / ignore
        VOCdevkit/VOC2012/ImageSets/Segmentation/<split>.txt

    Splits: ``train``, ``val``, ``trainval``, ``test`` (images only). See :class:`BaseDataset` for the arguments.
    """

    NAME = "pascal_voc"
    NUM_CLASS = 21
    CLASSES = VOC_CLASSES
    PALETTE = VOC_PALETTE
    IGNORE_COLOR = VOC_IGNORE_COLOR
    SPLITS = ("train", "val", "trainval", "test")
    PREPARE_SCRIPT = "scripts/prepare_pascal.py"
    BASE_DIR = os.path.join("VOCdevkit", "VOC2012")

    def _find_samples(self) -> Tuple[List[str], Optional[List[str]]]:
        base = self.dataset_dir
        return list_split(os.path.join(base, "ImageSets", "Segmentation", self.split + ".txt"),
                          os.path.join(base, "JPEGImages"), ".jpg",
                          None if self.split == "test" else os.path.join(base, "SegmentationClass"), ".png")


def prepare_pascal(root: Optional[str] = None, *, voc: bool = True, aug: bool = True,
                   download_dir: Optional[str] = None, mirror: Optional[str] = None,
                   checksums: Optional[Mapping[str, Optional[str]]] = None, overwrite: bool = False,
                   progress: bool = True) -> List[str]:
    """Download and extract PASCAL VOC 2012 and/or the SBD augmented set (``VOCaug``) into ``root``.

    SBD's ``benchmark_RELEASE`` folder becomes ``VOCaug`` and ``VOCaug/dataset/trainval.txt`` (train + val) is
    written, the layout ``pascal_aug`` reads.

    Args:
        root: data root (default :func:`default_root`).
        voc: fetch VOC 2012 (``pascal_voc``).
        aug: fetch SBD (``pascal_aug``).
        download_dir: where archives are kept (default ``<root>/downloads``).
        mirror, checksums, overwrite, progress: see :func:`fetch_resources`.

    Returns:
        The prepared dataset folders.
    """
    root = os.path.expanduser(root or default_root())
    download_dir = download_dir or os.path.join(root, "downloads")
    out = []
    kwargs = dict(mirror=mirror, checksums=checksums, overwrite=overwrite, progress=progress)
    if voc:
        (archive,) = fetch_resources([RESOURCES["voc2012"]], download_dir, **kwargs)
        extract(archive, root, overwrite=overwrite, progress=progress)
        base = os.path.join(root, VOCSegmentation.BASE_DIR)
        read_split_file(os.path.join(base, "ImageSets", "Segmentation", "train.txt"))  # layout check
        out.append(base)
    if aug:
        (archive,) = fetch_resources([RESOURCES["sbd"]], download_dir, **kwargs)
        extract(archive, root, rename={"benchmark_RELEASE": "VOCaug"}, overwrite=overwrite, progress=progress)
        base = os.path.join(root, "VOCaug", "dataset")
        if not os.path.isdir(os.path.join(base, "cls")):
            raise DatasetError(os.path.join(base, "cls"), "missing after extraction; is the archive the right one?")
        ids = read_split_file(os.path.join(base, "train.txt")) + read_split_file(os.path.join(base, "val.txt"))
        atomic_write(os.path.join(base, "trainval.txt"), "".join(i + "\n" for i in dict.fromkeys(ids)))
        out.append(base)
    return out
