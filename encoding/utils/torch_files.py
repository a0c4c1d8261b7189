"""What a file handed to ``torch.load`` is, before and after torch reads it: the first bytes of ``torch.save``'s
output, and whether a weights-only refusal names a real object or a cut or garbled file's nothing."""
from __future__ import annotations

import re
import sys
from typing import Optional

__all__ = ["looks_like_torch_file", "global_naming_nothing"]

_REFUSED_GLOBAL = re.compile(r"Unsupported global: GLOBAL (\S*)")


def looks_like_torch_file(path: str) -> bool:
    """Whether the file starts like ``torch.save`` output: a zip archive or a pickle (protocol >= 2)."""
    with open(path, "rb") as f:
        head = f.read(4)
    return head.startswith(b"PK\x03\x04") or head[:1] == b"\x80"


def global_naming_nothing(message: str) -> Optional[str]:
    """The global a weights-only refusal (``message``) names, if it names nothing: no dotted Python name (``"."``,
    the ``GLOBAL`` line of a file cut in the middle), or a name missing from a module already imported
    (``collections.Ord``). ``None`` where it may be a real object: nothing is imported to find out."""
    match = _REFUSED_GLOBAL.search(message)
    if match is None:
        return None
    dotted = match.group(1)
    module, _, name = dotted.rpartition(".")
    if not (name.isidentifier() and all(part.isidentifier() for part in module.split("."))):
        return dotted
    loaded = sys.modules.get(module)
    return dotted if loaded is not None and not hasattr(loaded, name) else None
