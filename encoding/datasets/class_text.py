"""Reading a folder dataset's class file as text, with bounds: :data:`MAX_CLASS_FILE` bytes of UTF-8, and YAML
without aliases (:func:`load_yaml`). The class file's meaning is :mod:`.folder_meta`'s."""
from __future__ import annotations

import os
from typing import Any

from .layout import DatasetError

__all__ = ["MAX_CLASS_FILE", "read_text", "load_yaml"]

#: The bound of a class file's size in bytes.
MAX_CLASS_FILE = 1 << 20


def read_text(path: str) -> str:
    """The text of a class file: at most :data:`MAX_CLASS_FILE` bytes of UTF-8, else one line saying why not."""
    size = os.path.getsize(path)
    if size > MAX_CLASS_FILE:
        raise DatasetError(path, f"class file of {size:,} bytes is over {MAX_CLASS_FILE:,} bytes: is it the right "
                                 "file?")
    with open(path, "rb") as f:
        raw = f.read(MAX_CLASS_FILE + 1)
    if b"\0" in raw:
        raise DatasetError(path, "is a binary file, not a class file (text: one class per line, or YAML / JSON)")
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise DatasetError(path, f"is not UTF-8 text (byte 0x{raw[err.start]:02x} at offset {err.start}): save it "
                                 "as UTF-8") from None


def load_yaml(text: str) -> Any:
    """``yaml.safe_load`` without aliases (``*name``): a "billion laughs" file is refused, not expanded."""
    import yaml  # PyYAML: only for a classes.yaml

    class NoAliases(yaml.SafeLoader):
        def compose_node(self, parent: Any, index: Any) -> Any:
            if self.check_event(yaml.AliasEvent):
                mark = self.peek_event().start_mark
                raise yaml.YAMLError(f"line {mark.line + 1}: YAML aliases (*{self.peek_event().anchor}) are not "
                                     "allowed in a class file")
            return super().compose_node(parent, index)

    return yaml.load(text, Loader=NoAliases)  # noqa: S506 (a SafeLoader)
