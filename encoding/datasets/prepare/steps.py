"""The ``prepare_<name>`` functions: each real dataset is a :class:`Recipe`, prepared by one shared path.

:func:`run_recipe` resolves the data root, fetches the recipe's files (verified downloads or mirror copies, reused
when already there: :func:`~encoding.datasets.prepare.download.fetch_resources`) and hands them to :func:`install`,
which extracts the archives (all or nothing; a marker per archive makes re-runs skip it), checks that the layout is
there and runs the recipe's converter. Cityscapes (login-gated) only swaps the fetch for checks of the two packages
downloaded by hand. ``shapes`` is generated, not downloaded: :func:`prepare_shapes` is
:func:`~encoding.datasets.prepare.shapes_render.ensure_shapes`. The folder names come from
:mod:`encoding.datasets.layout`, which the dataset classes read too: nothing here imports a dataset class.
"""
from __future__ import annotations

import os
from typing import Callable, Dict, List, Mapping, NamedTuple, Optional, Sequence, Tuple

from ...errors import UsageError
from ..layout import (ADE20K_DIR, CITYS_DIR, COCO_DIR, CONTEXT_DIR, SBD_DIR, VOC_DIR, DatasetError,
                      default_root)
from ...utils.files import verify_checksum
from .coco_masks import build_coco_masks
from .download import Resource, extract, fetch_resources
from .location import announce_writing
from .pcontext_json import convert_context_annotations
from .sbd import convert_sbd_masks, write_sbd_trainval
from .shapes_render import ensure_shapes

__all__ = ["Recipe", "RECIPES", "ADE20K_RESOURCES", "VOC_RESOURCES", "CONTEXT_RESOURCES", "COCO_RESOURCES",
           "CITYS_PACKAGES", "CITYS_INSTRUCTIONS", "resolve_root", "install", "run_recipe", "prepare_ade20k",
           "prepare_pascal", "prepare_pcontext", "prepare_citys", "prepare_coco", "prepare_shapes"]

ADE20K_RESOURCES = {
    "trainval": Resource("http://data.csail.mit.edu/places/ADEchallenge/ADEChallengeData2016.zip",
                         "sha1:219e1696abb36c8ba3a3afe7fb2f4b4606a897c7"),
    "test": Resource("http://data.csail.mit.edu/places/ADEchallenge/release_test.zip",
                     "sha1:e05747892219d10e9243933371a497e905a4860c"),
}
VOC_RESOURCES = {
    "voc2012": Resource("http://host.robots.ox.ac.uk/pascal/VOC/voc2012/VOCtrainval_11-May-2012.tar",
                        "md5:6cd6e144f989b92b3379bac3b3de84fd"),
    "sbd": Resource("http://www.eecs.berkeley.edu/Research/Projects/CS/vision/grouping/semantic_contours/"
                    "benchmark.tgz", "md5:82b4d87ceb2ed10f6038a1cba92111cb"),
}
CONTEXT_RESOURCES = {
    "voc2010": Resource("http://host.robots.ox.ac.uk/pascal/VOC/voc2010/VOCtrainval_03-May-2010.tar",
                        "md5:da459979d0c395079b5c75ee67908abb"),
    "annotations": Resource("https://codalabuser.blob.core.windows.net/public/trainval_merged.json",
                            "md5:3c2d0c0656b7be9eb61928ffe885d8ce"),
}
COCO_RESOURCES = {
    "train": Resource("http://images.cocodataset.org/zips/train2017.zip", "md5:cced6f7f71b7629ddf16f17bbcfab6b2"),
    "val": Resource("http://images.cocodataset.org/zips/val2017.zip", "md5:442b8da7639aecaf257c1dceb8ba8c80"),
    "annotations": Resource("http://images.cocodataset.org/annotations/annotations_trainval2017.zip",
                            "md5:f4bbac642086de4f52a3fdda2de5fa2c"),
}
#: The two login-gated packages from https://www.cityscapes-dataset.com/downloads/ (no public checksum).
CITYS_PACKAGES = ("gtFine_trainvaltest.zip", "leftImg8bit_trainvaltest.zip")
CITYS_INSTRUCTIONS = """\
Cityscapes needs a (free) login, so it cannot be downloaded automatically:
  1. register at https://www.cityscapes-dataset.com/register/
  2. download gtFine_trainvaltest.zip (241 MB) and leftImg8bit_trainvaltest.zip (11 GB) from
     https://www.cityscapes-dataset.com/downloads/
  3. run: python scripts/prepare_citys.py --zips <folder holding the two zips> [--root <data root>]
"""

#: ``convert(folder, files, overwrite, progress)``: turns what was extracted into the layout the dataset reads.
Converter = Callable[[str, Sequence[str], bool, bool], None]


class Recipe(NamedTuple):
    """How one dataset is prepared (see :func:`install`).

    Attributes:
        folder: the dataset folder, relative to the data root (what the prepare function returns).
        archives: what is fetched and extracted, in order (empty when the archives are local: Cityscapes).
        expected: paths under ``folder`` that must exist after extraction (a wrong archive is caught here).
        extract_to: where the archives are extracted, relative to the data root (``""``: the root itself).
        rename: top-level names renamed while extracting (see :func:`~encoding.datasets.prepare.download.extract`).
        files: what is fetched but not extracted; handed to ``convert``.
        convert: the prepare-time conversion (``None``: the extracted files are read as they are).
    """

    folder: str
    archives: Tuple[Resource, ...]
    expected: Tuple[str, ...]
    extract_to: str = ""
    rename: Optional[Mapping[str, str]] = None
    files: Tuple[Resource, ...] = ()
    convert: Optional[Converter] = None


def _write_sbd_trainval(folder: str, files: Sequence[str], overwrite: bool, progress: bool) -> None:
    """SBD's ``trainval.txt`` (train + val, de-duplicated), the split ``pascal_aug`` reads, as in PyTorch-Encoding;
    and the ``.mat`` labels converted to PNGs once, here, so loading reads PNGs."""
    del files
    write_sbd_trainval(folder)
    convert_sbd_masks(folder, overwrite=overwrite, progress=progress)


def _convert_context(folder: str, files: Sequence[str], overwrite: bool, progress: bool) -> None:
    """PASCAL-Context's ``trainval_merged.json`` (the one file of the recipe) into label PNGs under ``folder``."""
    (annotations,) = files
    convert_context_annotations(annotations, folder, overwrite=overwrite, progress=progress)


def _build_coco_masks(folder: str, files: Sequence[str], overwrite: bool, progress: bool) -> None:
    """The VOC-class masks of both COCO splits (validation first: it is the quick one)."""
    del files
    for split in ("val", "train"):
        build_coco_masks(folder, split, overwrite=overwrite, progress=progress)


_ADE20K_EXPECTED = ("images/training", "annotations/training", "images/validation", "annotations/validation")

#: Recipe name -> recipe (``prepare_pascal`` runs ``pascal_voc`` and ``pascal_aug``; options adjust a recipe with
#: ``_replace``: ADE20K's test images, COCO without masks).
RECIPES: Dict[str, Recipe] = {
    "ade20k": Recipe(ADE20K_DIR, (ADE20K_RESOURCES["trainval"],), _ADE20K_EXPECTED),
    "pascal_voc": Recipe(VOC_DIR, (VOC_RESOURCES["voc2012"],),
                         (os.path.join("ImageSets", "Segmentation", "train.txt"),)),
    "pascal_aug": Recipe(SBD_DIR, (VOC_RESOURCES["sbd"],), ("cls",),
                         rename={"benchmark_RELEASE": "VOCaug"}, convert=_write_sbd_trainval),
    "pcontext": Recipe(CONTEXT_DIR, (CONTEXT_RESOURCES["voc2010"],), ("JPEGImages",),
                       files=(CONTEXT_RESOURCES["annotations"],), convert=_convert_context),
    "citys": Recipe(CITYS_DIR, (), ("leftImg8bit/train", "leftImg8bit/val", "gtFine/train",
                                                   "gtFine/val"), extract_to=CITYS_DIR),
    "coco": Recipe(COCO_DIR, tuple(COCO_RESOURCES[k] for k in ("annotations", "val", "train")),
                   ("annotations", "train2017", "val2017"), extract_to=COCO_DIR,
                   convert=_build_coco_masks),
}


def resolve_root(root: Optional[str] = None) -> str:
    """The data root to prepare into: ``root`` (``~`` expanded) or :func:`~encoding.datasets.default_root`."""
    return os.path.expanduser(root or default_root())


def _missing(recipe: Recipe, folder: str) -> Optional[str]:
    """The first of the recipe's expected paths missing under ``folder``, else ``None``."""
    paths = (os.path.join(folder, path) for path in recipe.expected)
    return next((path for path in paths if not os.path.exists(path)), None)


def install(recipe: Recipe, root: str, archives: Sequence[str], files: Sequence[str] = (), *,
            overwrite: bool = False, progress: bool = True) -> str:
    """Extract local ``archives`` into the root, check the recipe's layout and run its converter (saying first
    where the dataset goes: :func:`~.location.announce_writing`).

    The markers that make a re-run skip an archive are trusted only when every expected path is there: a dataset
    folder removed since (its archive's top-level folder still holding another dataset) is extracted again.

    Args:
        recipe: what lands where (:class:`Recipe`).
        root: the (resolved) data root.
        archives: local archive paths, extracted in order into ``<root>/<recipe.extract_to>``.
        files: local files handed to ``recipe.convert`` as they are.
        overwrite: extract and convert again even if done before.
        progress: show progress bars.

    Returns:
        The dataset folder ``<root>/<recipe.folder>``.

    Raises:
        DatasetError: an expected path is missing after extraction (the wrong archive).
    """
    announce_writing("the prepared dataset", os.path.join(root, recipe.folder), root)
    dest = os.path.join(root, recipe.extract_to) if recipe.extract_to else root
    folder = os.path.join(root, recipe.folder)
    # An archive's marker only vouches for its top-level entries, which another dataset may share (VOC 2012 and
    # VOC 2010 both ship VOCdevkit/): a dataset that is not all there is extracted again, whatever the markers say.
    redo = overwrite or _missing(recipe, folder) is not None
    for archive in archives:
        extract(archive, dest, rename=recipe.rename, overwrite=redo, progress=progress)
    missing = _missing(recipe, folder)
    if missing:
        raise DatasetError(missing, "missing after extraction; is the archive the right one?")
    if recipe.convert is not None:
        recipe.convert(folder, files, overwrite, progress)
    return folder


def run_recipe(recipe: Recipe, root: Optional[str] = None, *, download_dir: Optional[str] = None,
               mirror: Optional[str] = None, checksums: Optional[Mapping[str, Optional[str]]] = None,
               overwrite: bool = False, progress: bool = True) -> str:
    """Resolve the root, fetch the recipe's archives and files, then :func:`install` them: the one prepare path.

    Args:
        recipe: what to fetch and how to lay it out.
        root: data root (default :func:`~encoding.datasets.default_root`).
        download_dir: where the downloads are kept (default ``<root>/downloads``).
        mirror, checksums, overwrite, progress: see :func:`~encoding.datasets.prepare.download.fetch_resources`
            (``overwrite`` also extracts and converts again).

    Returns:
        The dataset folder ``<root>/<recipe.folder>``.
    """
    root = resolve_root(root)
    announce_writing("the prepared dataset", os.path.join(root, recipe.folder), root)  # before the first download
    paths = fetch_resources(recipe.archives + recipe.files, download_dir or os.path.join(root, "downloads"),
                            mirror=mirror, checksums=checksums, overwrite=overwrite, progress=progress)
    count = len(recipe.archives)
    return install(recipe, root, paths[:count], paths[count:], overwrite=overwrite, progress=progress)


def prepare_ade20k(root: Optional[str] = None, *, download_dir: Optional[str] = None, mirror: Optional[str] = None,
                   checksums: Optional[Mapping[str, Optional[str]]] = None, with_test: bool = False,
                   overwrite: bool = False, progress: bool = True) -> str:
    """Download and extract ADE20K into ``root`` (see :func:`run_recipe`).

    Args:
        root, download_dir, mirror, checksums, overwrite, progress: see :func:`run_recipe`.
        with_test: also fetch the unlabelled test images (``release_test``).

    Returns:
        The dataset folder ``<root>/ADEChallengeData2016``.
    """
    recipe = RECIPES["ade20k"]
    if with_test:
        recipe = recipe._replace(archives=recipe.archives + (ADE20K_RESOURCES["test"],))
    return run_recipe(recipe, root, download_dir=download_dir, mirror=mirror, checksums=checksums,
                      overwrite=overwrite, progress=progress)


def prepare_pascal(root: Optional[str] = None, *, voc: bool = True, aug: bool = True,
                   download_dir: Optional[str] = None, mirror: Optional[str] = None,
                   checksums: Optional[Mapping[str, Optional[str]]] = None, overwrite: bool = False,
                   progress: bool = True) -> List[str]:
    """Download and extract PASCAL VOC 2012 and/or the SBD augmented set (``VOCaug``) into ``root``.

    SBD's ``benchmark_RELEASE`` folder becomes ``VOCaug`` and ``VOCaug/dataset/trainval.txt`` (train + val) is
    written, the layout ``pascal_aug`` reads.

    Args:
        voc: fetch VOC 2012 (``pascal_voc``).
        aug: fetch SBD (``pascal_aug``).
        root, download_dir, mirror, checksums, overwrite, progress: see :func:`run_recipe`.

    Returns:
        The prepared dataset folders.

    Raises:
        UsageError: both ``voc`` and ``aug`` are off.
    """
    names = [name for name, wanted in (("pascal_voc", voc), ("pascal_aug", aug)) if wanted]
    if not names:
        raise UsageError("pascal: nothing to prepare with both VOC 2012 and SBD left out (--no-voc --no-aug)")
    return [run_recipe(RECIPES[name], root, download_dir=download_dir, mirror=mirror, checksums=checksums,
                       overwrite=overwrite, progress=progress) for name in names]


def prepare_pcontext(root: Optional[str] = None, *, download_dir: Optional[str] = None,
                     mirror: Optional[str] = None, checksums: Optional[Mapping[str, Optional[str]]] = None,
                     overwrite: bool = False, progress: bool = True) -> str:
    """Download VOC 2010 and ``trainval_merged.json``, extract, and convert the annotations to label PNGs.

    Args:
        root, download_dir, mirror, checksums, overwrite, progress: see :func:`run_recipe`.

    Returns:
        The dataset folder ``<root>/VOCdevkit/VOC2010``.
    """
    return run_recipe(RECIPES["pcontext"], root, download_dir=download_dir, mirror=mirror, checksums=checksums,
                      overwrite=overwrite, progress=progress)


def prepare_citys(root: Optional[str] = None, *, zips: Optional[str] = None,
                  checksums: Optional[Mapping[str, Optional[str]]] = None, overwrite: bool = False,
                  progress: bool = True) -> str:
    """Extract the two Cityscapes packages (downloaded by hand, see :data:`CITYS_INSTRUCTIONS`) into ``<root>/citys``.

    The zips are read where they are (no copy); extraction is all-or-nothing and skipped on re-runs.

    Args:
        root: data root (default :func:`~encoding.datasets.default_root`).
        zips: folder holding ``gtFine_trainvaltest.zip`` and ``leftImg8bit_trainvaltest.zip``.
        checksums: optional expected checksums per file name (verified before extracting).
        overwrite: extract again even if already done.
        progress: show progress bars.

    Returns:
        The dataset folder ``<root>/citys``.

    Raises:
        FileNotFoundError: ``zips`` not given or a package is missing (the message explains the manual download).
        ChecksumError: a package does not match its checksum.
    """
    if zips is None:
        raise FileNotFoundError(CITYS_INSTRUCTIONS)
    archives = [os.path.join(os.path.expanduser(zips), name) for name in CITYS_PACKAGES]
    for archive in archives:
        if not os.path.isfile(archive):
            raise FileNotFoundError(f"{archive} not found.\n{CITYS_INSTRUCTIONS}")
        expected = (checksums or {}).get(os.path.basename(archive))
        if expected is not None:
            verify_checksum(archive, expected, progress)
    return install(RECIPES["citys"], resolve_root(root), archives, overwrite=overwrite, progress=progress)


def prepare_coco(root: Optional[str] = None, *, download_dir: Optional[str] = None, mirror: Optional[str] = None,
                 checksums: Optional[Mapping[str, Optional[str]]] = None, build_masks: bool = True,
                 overwrite: bool = False, progress: bool = True) -> str:
    """Download and extract COCO 2017 into ``<root>/coco`` and build the VOC-class masks.

    Args:
        root, download_dir, mirror, checksums, overwrite, progress: see :func:`run_recipe`.
        build_masks: also build the masks (needs pycocotools).

    Returns:
        The dataset folder ``<root>/coco``.
    """
    recipe = RECIPES["coco"] if build_masks else RECIPES["coco"]._replace(convert=None)
    return run_recipe(recipe, root, download_dir=download_dir, mirror=mirror, checksums=checksums,
                      overwrite=overwrite, progress=progress)


#: ``shapes`` is generated, not downloaded: explicit preparation is the step the dataset runs on first use.
prepare_shapes = ensure_shapes
