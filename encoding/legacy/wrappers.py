"""mmcv / mmengine's wrapper check, recognising our wrappers and torch's (see ``docs/migration.md``).

``is_module_wrapper`` is declared in ``encoding.parallel`` beside its definition.
"""
from __future__ import annotations

from typing import Any, Optional

from torch import nn

from ..parallel import DataParallelCriterion
from .declare import old_name

__all__ = ["MODULE_WRAPPERS", "is_module_wrapper"]

class WrapperList(list):
    """A list of wrapper classes with mmcv's registry decorator: ``@MODULE_WRAPPERS.register_module()``."""

    def register_module(self, name: Optional[str] = None, force: bool = False,
                        module: Optional[type] = None) -> Any:
        """Add a wrapper class (mmcv's ``Registry.register_module``: as a decorator, or with ``module=``); ``name``
        and ``force`` are accepted for mmcv's signature (the list has no names)."""
        def register(cls: type) -> type:
            if not isinstance(cls, type):
                raise TypeError(f"register_module expects a class, got {cls!r}")
            if cls not in self:
                self.append(cls)
            return cls

        return register(module) if module is not None else register


#: Classes whose instances wrap a ``.module``: torch's data-parallel wrappers (``DataParallelModel`` and
#: ``DataParallelWithCallback`` are ``nn.DataParallel``s) and ``DataParallelCriterion``. Append your own, or
#: register it as mmcv does (``@MODULE_WRAPPERS.register_module()``).
MODULE_WRAPPERS = WrapperList([nn.DataParallel, nn.parallel.DistributedDataParallel, DataParallelCriterion])


@old_name("encoding.parallel")
def is_module_wrapper(module: object) -> bool:
    """True when ``module`` is a data-parallel wrapper whose ``.module`` is the wrapped network (mmcv's check).

    Example:
        >>> is_module_wrapper(nn.DataParallel(nn.Linear(1, 1), device_ids=[]))
        True
    """
    return isinstance(module, tuple(MODULE_WRAPPERS))
