"""Class weights from a training set's label frequencies (``train.py --class-weights auto|median|FILE``).

One pass over the full-size training masks (:meth:`BaseDataset.label_map`, one ``bincount`` each) counts, per class,
its pixels ``n_c`` and the valid pixels ``m_c`` of the images where it occurs. The counts are cached in
``<dataset_dir>/label_counts.json``, one entry per ``dataset/split/samples``, stamped with the data root and a
fingerprint of the mask files (names, sizes, modification times): changed masks are counted again. From the counts:

* ``enet`` (``auto``), ENet's (Paszke et al. 2016): ``w_c = 1 / ln(1.02 + p_c)`` with ``p_c = n_c / sum_k n_k``
  (bounded in ``(0.98, 50.5]``; an absent class gets the largest weight, which no pixel uses);
* ``median``, median-frequency balancing (Eigen & Fergus 2015): ``w_c = median(f) / f_c`` with ``f_c = n_c / m_c``,
  the median over the classes that occur (the lower middle value for an even count, as ``torch.median``); an absent
  class gets weight 0.
"""
from __future__ import annotations

import hashlib
import json
import os
import warnings
from typing import Any, Dict, List, Optional, Union

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Dataset, Subset

from ..utils.determinism import SeededSamples
from ..utils.files import atomic_write, user_cache_file
from ..utils.progress import progress_bar
from .base import BaseDataset
from .layout import DatasetError

__all__ = ["CLASS_WEIGHT_METHODS", "label_counts", "class_weights", "read_class_weights", "resolve_class_weights",
           "class_weights_problem"]

#: ``--class-weights`` values computed from the data (``auto`` is ``enet``).
CLASS_WEIGHT_METHODS = ("auto", "enet", "median")
CACHE_FILE = "label_counts.json"
#: The largest class-weight file read (bytes).
MAX_BYTES = 1 << 20


def _samples(dataset: Dataset) -> tuple:
    """``(BaseDataset, indices)`` behind ``dataset`` (``Subset`` / ``SeededSamples`` wrappers unwrapped)."""
    indices: Optional[List[int]] = None
    while isinstance(dataset, (Subset, SeededSamples)):
        if isinstance(dataset, Subset):
            indices = [dataset.indices[i] for i in (indices if indices is not None else range(len(dataset)))]
        dataset = dataset.dataset
    if not isinstance(dataset, BaseDataset) or dataset.masks is None:
        raise ValueError(f"class weights from label frequencies need a segmentation dataset with masks "
                         f"(an encoding.datasets BaseDataset), got {type(dataset).__name__}")
    return dataset, list(indices if indices is not None else range(len(dataset)))


def _fingerprint(paths: List[str]) -> str:
    digest = hashlib.sha1()
    for path in paths:
        st = os.stat(path)
        digest.update(f"{path}\t{st.st_size}\t{st.st_mtime_ns}\n".encode())
    return digest.hexdigest()


def _count(dataset: BaseDataset, indices: List[int], progress: bool) -> Dict[str, List[int]]:
    nclass = dataset.NUM_CLASS
    pixels = np.zeros(nclass, dtype=np.int64)
    image_pixels = np.zeros(nclass, dtype=np.int64)
    for i in progress_bar(indices, desc="class frequencies", disable=not progress):
        counts = np.bincount(dataset.label_map(i).ravel(), minlength=256)[:nclass]
        pixels += counts
        image_pixels += (counts > 0) * counts.sum()
    return {"pixels": pixels.tolist(), "image_pixels": image_pixels.tolist()}


def label_counts(dataset: Dataset, *, cache: bool = True, progress: bool = True) -> Dict[str, Any]:
    """Per-class pixel counts of ``dataset``'s masks, from the cache when the masks are unchanged.

    Args:
        dataset: an :class:`~encoding.datasets.base.BaseDataset` (or a ``Subset`` of one); its full-size masks are
            read, whatever its mode's crops.
        cache: read / write the cache file (:func:`cache_path`; a folder that cannot be written only warns).
        progress: show a progress bar while counting.

    Returns:
        The cache entry: ``dataset``, ``split``, ``root``, ``samples``, ``fingerprint`` (the mask files),
        ``labels`` (a digest of :meth:`~encoding.datasets.base.BaseDataset.label_encoding`), ``pixels`` (``n_c``),
        ``image_pixels`` (``m_c``) and ``cached`` (whether it came from the cache).
    """
    base, indices = _samples(dataset)
    masks = [base.masks[i] for i in indices]
    entry = {"dataset": base.NAME or type(base).__name__, "split": base.split, "root": base.root,
             "samples": len(indices), "fingerprint": _fingerprint(masks),
             "labels": hashlib.sha1(base.label_encoding()).hexdigest()}  # the masks read as other classes: recount
    key = f"{entry['dataset']}/{entry['split']}/{entry['samples']}"
    path = cache_path(base)
    entries = _read_cache(path) if cache else {}
    found = entries.get(key)
    if isinstance(found, dict) and all(found.get(k) == v for k, v in entry.items()):
        if _valid_counts(found, base.NUM_CLASS):
            return dict(found, cached=True)
        warnings.warn(f"ignoring the edited or corrupt entry {key!r} of the label-count cache {path}: counting again")
    entry.update(_count(base, indices, progress))
    if cache:
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)  # the user's cache folder may not exist yet
            atomic_write(path, json.dumps(dict(entries, **{key: entry}), indent=1))
        except OSError as e:
            warnings.warn(f"cannot cache the label counts in {path}: {e}")
    return dict(entry, cached=False)


def cache_path(base: BaseDataset) -> str:
    """Where :func:`label_counts` caches ``base``'s counts: ``<dataset_dir>/label_counts.json`` beside the data the
    toolkit prepared, the user's cache folder for a user's folder (``WRITES_BESIDE_DATA`` false: nothing is written
    into it; :func:`~encoding.utils.files.user_cache_file`)."""
    if base.WRITES_BESIDE_DATA:
        return os.path.join(base.dataset_dir, CACHE_FILE)
    return user_cache_file("label_counts", base.dataset_dir)


def _valid_counts(entry: Dict[str, Any], nclass: int) -> bool:
    """Whether a cache entry's ``pixels`` / ``image_pixels`` are ``nclass`` non-negative ints each, with a labelled
    pixel (anything else, e.g. an edited file, is counted again)."""
    lists = [entry.get("pixels"), entry.get("image_pixels")]
    if not all(isinstance(v, list) and len(v) == nclass for v in lists):
        return False
    if not all(isinstance(n, int) and not isinstance(n, bool) and 0 <= n < 1 << 62 for v in lists for n in v):
        return False
    return sum(lists[0]) > 0


def _read_cache(path: str) -> Dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as f:
            entries = json.load(f)
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        warnings.warn(f"ignoring the unreadable label-count cache {path}: {e}")
        return {}
    return entries if isinstance(entries, dict) else {}


def class_weights(counts: Dict[str, Any], method: str = "enet") -> Tensor:
    """Class weights (float64) from :func:`label_counts`' ``pixels`` / ``image_pixels`` by ``method``.

    Raises:
        ValueError: an unknown method, or no labelled pixel at all.
    """
    pixels = torch.tensor(counts["pixels"], dtype=torch.float64)
    if pixels.sum() <= 0:
        raise ValueError("class weights: the training masks hold no labelled pixel")
    method = "enet" if method == "auto" else method
    if method == "enet":
        return 1.0 / torch.log(1.02 + pixels / pixels.sum())
    if method == "median":
        present = pixels > 0
        freq = pixels / torch.tensor(counts["image_pixels"], dtype=torch.float64).clamp_min(1)
        return torch.where(present, freq[present].median() / freq.clamp_min(1e-300), 0.0)
    raise ValueError(f"unknown class-weight method {method!r}; choose one of {', '.join(CLASS_WEIGHT_METHODS)}")


def read_class_weights(path: Union[str, os.PathLike]) -> Tensor:
    """Finite non-negative numbers from a file: a JSON list, or numbers separated by white space or commas.

    Raises:
        DatasetError: the file cannot be read, or holds something else (the message names the file).
    """
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read(MAX_BYTES + 1)
        if len(text) > MAX_BYTES:
            raise ValueError(f"larger than {MAX_BYTES // 1024} KiB")
        values = json.loads(text) if text.lstrip().startswith("[") else text.replace(",", " ").split()
        weight = torch.tensor([float(v) for v in values], dtype=torch.float64)
    except (OSError, ValueError, TypeError, RecursionError) as e:
        raise DatasetError(str(path), f"not {'/'.join(CLASS_WEIGHT_METHODS)} nor a readable list of class "
                                      f"weights ({e})") from None
    if not torch.isfinite(weight).all() or (weight < 0).any():
        raise DatasetError(str(path), f"class weights must be finite and >= 0, got {weight.tolist()}")
    return weight


def class_weights_problem(spec: Union[None, str, os.PathLike], nclass: Optional[int]) -> Optional[str]:
    """Why ``--class-weights spec`` cannot be used with ``nclass`` classes (``None``: it can, or it is computed from
    the data): a FILE that is missing, unreadable, not numbers, or not ``nclass`` of them (not counted when
    ``nclass`` is ``None``: a class count known only from the data). Asked before any data is read or generated.
    """
    if spec is None or str(spec) in CLASS_WEIGHT_METHODS:
        return None
    try:
        weight = read_class_weights(spec)
    except DatasetError as err:
        return f"--class-weights {spec}: {err.problem.splitlines()[0]}"
    if nclass is not None and weight.numel() != nclass:
        return f"--class-weights {spec}: holds {weight.numel()} class weights; the dataset has {nclass} classes"
    return None


def resolve_class_weights(spec: Union[None, str, os.PathLike], dataset: Optional[Dataset], nclass: int, *,
                          progress: bool = True) -> Optional[Tensor]:
    """``--class-weights``: ``None``; ``auto`` / ``enet`` / ``median`` from ``dataset``'s labels; or a file holding
    ``nclass`` numbers (:func:`read_class_weights`).

    Raises:
        DatasetError: a file that cannot be read or parsed, or holds a wrong number of values (one line naming it).
        ValueError: ``auto`` / ``median`` without a dataset.
    """
    if spec is None:
        return None
    if str(spec) in CLASS_WEIGHT_METHODS:
        if dataset is None:
            raise ValueError(f"--class-weights {spec} needs the training dataset")
        return class_weights(label_counts(dataset, progress=progress), str(spec))
    weight = read_class_weights(spec)
    if weight.numel() != nclass:
        raise DatasetError(str(spec), f"holds {weight.numel()} class weights; the dataset has {nclass} classes")
    return weight
