"""The files one evaluation run writes per sample (``test.py --save-pred``): where a sample's prediction and error
map go (:func:`prediction_filename`), and the claim of each file before it is written (:class:`OutputClaims`), so that
no output of a run replaces another."""
from __future__ import annotations

import os
from typing import Dict, List, Optional, Sequence

from torch.utils.data import Dataset, Subset

from ..errors import UsageError

__all__ = ["ERRORS_DIR", "OutputClaims", "prediction_filename", "sample_names"]


def prediction_filename(name: str) -> str:
    """The file, relative to the output folder, a prediction of the sample ``name`` is written to:
    ``"2008_000123.jpg"`` -> ``"2008_000123.png"``; a relative name keeps its folders (``"cam_a/0001.jpg"`` ->
    ``"cam_a/0001.png"``, a folder dataset's :meth:`~encoding.datasets.base.BaseDataset.sample_name`); an absolute
    path or one going up keeps its file name only (``"/data/x/0001.jpg"`` -> ``"0001.png"``)."""
    parts = name.replace(os.sep, "/").split("/")
    if os.path.isabs(name) or ".." in parts:
        parts = parts[-1:]
    return os.path.join(*[p for p in parts[:-1] if p not in ("", ".")], os.path.splitext(parts[-1])[0] + ".png")


#: The sub-folder of a ``--save-pred`` folder that the error maps go to (``PredictionWriter.errors_dir``).
ERRORS_DIR = "errors"


class OutputClaims:
    """The files of one run's samples, each claimed before it is written: no output of a run replaces another.

    Attributes:
        owners: ``{path: "the prediction of 'a.jpg'", ...}``, every path claimed.
    """

    def __init__(self) -> None:
        self.owners: Dict[str, str] = {}

    def claim(self, folder: str, name: str, kind: str) -> str:
        """The file in ``folder`` of the ``kind`` (``"prediction"``, ``"error map"``) of the sample ``name``
        (:func:`prediction_filename`), claimed.

        Raises:
            UsageError: the file is claimed already (by another sample, or another sample of the same name, case
                ignored): one line naming both samples.
        """
        path = os.path.join(folder, prediction_filename(name))
        # compared ignoring case: ``A.png`` and ``a.png`` are one file on macOS and Windows (and wherever the folder
        # is copied to one of them)
        owner, key = f"the {kind} of {name!r}", os.path.abspath(path).casefold()
        if key in self.owners:
            raise UsageError(f"{self.owners[key]} and {owner} would both be written to {path} (names are compared "
                             "ignoring case): rename one of them (--save-pred DIR writes DIR/<name>.png, and "
                             f"DIR/{ERRORS_DIR}/<name>.png when scoring; --mode test writes no error maps)")
        self.owners[key] = owner
        return path


def sample_names(dataset: Dataset) -> Optional[List[str]]:
    """The names of ``dataset``'s samples (its ``sample_name``, through ``Subset`` s, no sample read), else ``None``."""
    indices: Sequence[int] = range(len(dataset))
    while isinstance(dataset, Subset):
        indices, dataset = [dataset.indices[i] for i in indices], dataset.dataset
    name = getattr(dataset, "sample_name", None)
    return [name(i) for i in indices] if callable(name) else None
