"""Where prepared and generated data go, said once: the first time a process writes under a data folder it prints
``data: writing <what> to <folder> (<where the root comes from>)``.

The data root is ``~/.encoding/data`` unless ``ENCODING_DATA`` says otherwise (:func:`~encoding.datasets.default_root`),
or the folder a command was given (``--root``, ``--data-root``).
"""
from __future__ import annotations

import os
from typing import Set

from ..layout import default_root

__all__ = ["root_origin", "announce_writing"]

_ANNOUNCED: Set[str] = set()


def root_origin(root: str) -> str:
    """Where the data root ``root`` comes from, for a message: ``ENCODING_DATA``, the default, or given."""
    if os.path.abspath(os.path.expanduser(root)) != os.path.abspath(default_root()):
        return "the data root given"
    if os.environ.get("ENCODING_DATA"):
        return "the data root, from ENCODING_DATA"
    return "the default data root ~/.encoding/data; set ENCODING_DATA to choose another"


def announce_writing(what: str, folder: str, root: str) -> None:
    """Print where ``what`` is written (``folder``, under the data root ``root``), once per folder and process."""
    folder = os.path.abspath(os.path.expanduser(folder))
    if folder in _ANNOUNCED:
        return
    _ANNOUNCED.add(folder)
    print(f"data: writing {what} to {folder} ({root_origin(root)})", flush=True)
