"""mmcv / mmengine's wrapper check, recognising our wrappers and torch's (see ``docs/migration.md``).

``is_module_wrapper`` is declared in ``encoding.parallel`` beside its definition.
"""
from __future__ import annotations

from torch import nn

from ..parallel import DataParallelCriterion
from .declare import old_name

__all__ = ["MODULE_WRAPPERS", "is_module_wrapper"]

#: Classes whose instances wrap a ``.module``: torch's data-parallel wrappers (``DataParallelModel`` and
#: ``DataParallelWithCallback`` are ``nn.DataParallel``s) and ``DataParallelCriterion``. Append your own.
MODULE_WRAPPERS = [nn.DataParallel, nn.parallel.DistributedDataParallel, DataParallelCriterion]


@old_name("encoding.parallel")
def is_module_wrapper(module: object) -> bool:
    """True when ``module`` is a data-parallel wrapper whose ``.module`` is the wrapped network (mmcv's check).

    Example:
        >>> is_module_wrapper(nn.DataParallel(nn.Linear(1, 1), device_ids=[]))
        True
    """
    return isinstance(module, tuple(MODULE_WRAPPERS))
