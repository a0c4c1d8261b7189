"""Behaviour added to a module in place by swapping its class for a generated subclass (as
``torch.nn.utils.parametrize`` does): parameters, buffers, state-dict keys, hooks and ``isinstance`` checks stay as
they are, and data-parallel replicas, ``copy.deepcopy`` and pickling keep the module's state.

Used by activation recomputation (:func:`encoding.nn.enable_checkpointing`, ``Checkpointed<Class>``) and by compiled
training (:func:`encoding.engine.compile_model`, ``Compiled<Class>``).
"""
from __future__ import annotations

from typing import Dict, Type

from torch import nn

__all__ = ["ClassSwap"]


class ClassSwap:
    """Generated subclasses ``<prefix><Class>`` of ``(mixin, Class)``, one per class, each recording its base class
    under ``base_attribute``.

    Args:
        mixin: the class whose methods come first (e.g. a ``forward`` that wraps ``super().forward``).
        prefix: the generated classes' name prefix.
        base_attribute: the class attribute naming the original class (what :meth:`restore` swaps back to).
    """

    def __init__(self, mixin: type, prefix: str, base_attribute: str) -> None:
        self.mixin, self.prefix, self.base_attribute = mixin, prefix, base_attribute
        self._classes: Dict[type, type] = {}

    def subclass(self, cls: Type[nn.Module]) -> type:
        """The generated subclass of ``cls`` (made once)."""
        if cls not in self._classes:
            self._classes[cls] = type(f"{self.prefix}{cls.__name__}", (self.mixin, cls), {self.base_attribute: cls})
        return self._classes[cls]

    def applied(self, module: nn.Module) -> bool:
        """Whether ``module``'s class is a generated one."""
        return isinstance(module, self.mixin)

    def apply(self, module: nn.Module) -> nn.Module:
        """Swap ``module``'s class for its generated subclass (once); returns ``module``."""
        if not self.applied(module):
            module.__class__ = self.subclass(type(module))
        return module

    def restore(self, module: nn.Module) -> nn.Module:
        """Swap ``module``'s class back to the original; returns ``module``."""
        if self.applied(module):
            module.__class__ = getattr(type(module), self.base_attribute)
        return module
