"""How an old name is declared: beside its object, once, naming the module(s) where users import it.

:func:`old_name` is the one mechanism (a leaf: it imports nothing of ``encoding`` but the target modules it binds
in). Beside a PyTorch-Encoding / vacancy / mmcv object defined in :mod:`encoding.legacy`::

    @old_name("encoding.nn", new="encoding.nn.SyncBatchNorm")
    class BatchNorm2d(...): ...

and for a core object under an old name (:mod:`encoding.legacy.aliases`)::

    get_dataset = alias(get_segmentation_dataset, "get_dataset", "encoding.datasets",
                        new="encoding.datasets.get_segmentation_dataset")

and for a module under an old path, each public name of the module declared there with :func:`alias`::

    old_module("encoding.nn.losses", "encoding.nn.loss")

Each declaration binds the name in its modules when the declaring module is imported (``import encoding`` imports
them: the alias table) and records it in :data:`DECLARED`; with ``new``, using the object (calling the function,
building an instance of the class) emits one :class:`EncodingDeprecationWarning` (a ``FutureWarning``) naming the
new spelling. No module resolves names
lazily (no module ``__getattr__``).
"""
from __future__ import annotations

import functools
import importlib
import importlib.machinery
import importlib.util
import sys
import types
import warnings
from typing import Any, Callable, Dict, Optional, Sequence, TypeVar

__all__ = ["DECLARED", "PEERS", "OWN", "EncodingDeprecationWarning", "old_name", "alias", "old_module"]

T = TypeVar("T")

#: Module -> {old name: the object it names there}: every declared old name (filled by :func:`old_name`).
DECLARED: Dict[str, Dict[str, Any]] = {}


#: Why an old name is kept, in its warning: for the peers' users (the default), or for this package's own older code.
PEERS = "kept for PyTorch-Encoding / Synchronized-BatchNorm / mmcv code"
OWN = "kept for code written for an older version of this package"


class EncodingDeprecationWarning(FutureWarning):
    """The warning of every old name (PyTorch-Encoding's name, also ``encoding.utils.EncodingDeprecationWarning``):
    ``warnings.filterwarnings("ignore", category=EncodingDeprecationWarning)`` silences them. A ``FutureWarning``,
    shown by default as before (PE's derived from ``DeprecationWarning``, which Python hides outside ``__main__``), so
    a filter on ``FutureWarning`` catches it too; one on ``DeprecationWarning`` does not."""


def _warning(name: str, where: tuple, new: str, why: str = PEERS) -> str:
    return f"{' / '.join(f'{w}.{name}' for w in where)} is an old name ({why}); use {new}"


def _deprecate(obj: T, message: str) -> T:
    """``obj`` (a class or a function) that emits ``EncodingDeprecationWarning(message)`` when used;
    ``__deprecated__`` holds the message (PEP 702). A class warns when it is instantiated (not when a subclass is)."""
    if isinstance(obj, type):
        init = obj.__init__

        @functools.wraps(init)
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            if type(self) is obj:
                warnings.warn(message, EncodingDeprecationWarning, stacklevel=2)
            init(self, *args, **kwargs)

        obj.__init__ = __init__  # type: ignore[misc]
        obj.__deprecated__ = message  # type: ignore[attr-defined]
        return obj

    @functools.wraps(obj)  # type: ignore[arg-type]
    def warned(*args: Any, **kwargs: Any) -> Any:
        warnings.warn(message, EncodingDeprecationWarning, stacklevel=2)
        return obj(*args, **kwargs)  # type: ignore[operator]

    warned.__deprecated__ = message  # type: ignore[attr-defined]
    return warned  # type: ignore[return-value]


def old_name(*where: str, new: Optional[str] = None, name: Optional[str] = None,
             star: Sequence[str] = ()) -> Callable[[T], T]:
    """Decorator: bind the decorated object as ``name`` (default: its ``__name__``) in each module of ``where``.

    Args:
        *where: the modules users import the name from (``"encoding.nn"``, ...).
        new: the spelling to use instead; given, using the object emits an :class:`EncodingDeprecationWarning` naming
            it.
        name: the old name, when it differs from the object's ``__name__``.
        star: the modules of ``where`` whose ``__all__`` lists the name, as the old module's did, so that users'
            ``from module import *`` brings it (PyTorch-Encoding's tests star-import ``encoding.utils.metrics``).

    Raises:
        RuntimeError: a module of ``where`` already defines a different object under that name (an old name never
            hides a core one).
    """
    def declare(obj: T) -> T:
        key = name or obj.__name__  # type: ignore[attr-defined]
        if new is not None:
            obj = _deprecate(obj, _warning(key, where, new))
        for module_name in where:
            module = importlib.import_module(module_name)
            current = vars(module).get(key, obj)
            if current is not obj:
                raise RuntimeError(f"encoding.legacy: {module_name}.{key} is already {current!r}; the old name "
                                   f"{obj!r} would hide it")
            setattr(module, key, obj)
            DECLARED.setdefault(module_name, {})[key] = obj
            if module_name in star and key not in module.__all__:
                module.__all__ = [*module.__all__, key]
        return obj
    return declare


def alias(obj: Any, name: str, *where: str, new: Optional[str] = None, why: str = PEERS) -> Any:
    """Declare the core object ``obj`` as ``name`` in each module of ``where``: a constant as is; with ``new``, a
    function as a wrapper and a class as a subclass that warn when used (the core object itself is untouched). An
    exception class is bound as it is (``except old.Error`` must catch what the core raises; it cannot warn).

    Args:
        why: why the old name is kept, said in its warning (:data:`PEERS` or :data:`OWN`).

    Returns:
        What was bound.
    """
    bound = obj
    if new is not None and not (isinstance(obj, type) and issubclass(obj, BaseException)):
        if isinstance(obj, type):
            bound = type(obj)(name, (obj,), {"__module__": where[0], "__qualname__": name, "__doc__": obj.__doc__})
        bound = _deprecate(bound, _warning(name, where, new, why))
        bound.__name__ = bound.__qualname__ = name
        bound.__module__ = where[0]
    return old_name(*where, name=name)(bound)


def old_module(name: str, new: str, why: str = OWN) -> types.ModuleType:
    """Declare ``name`` as the old path of the module ``new``: a module registered under ``name`` (``import name``
    and ``from name import X`` work; it is bound in its parent package), holding each name of ``new``'s ``__all__``
    declared with :func:`alias` (a function or a class warns naming ``<new>.<X>`` when used, a constant or an
    exception class is bound as it is); its ``__all__`` lists them, as the old module's did. The old module runs no
    code of ``new``'s file a second time: it only holds ``new``'s objects (or their warning wrappers).

    Returns:
        The old module.

    Raises:
        RuntimeError: ``name`` is already a module (a file or a declaration: an old path never hides a core one).
    """
    if name in sys.modules or importlib.util.find_spec(name) is not None:
        raise RuntimeError(f"encoding.legacy: {name} is already a module; the old path of {new} would hide it")
    target = importlib.import_module(new)
    parent, _, child = name.rpartition(".")
    module = types.ModuleType(name, f"The old path of :mod:`{new}`: its names warn when used (use {new}'s).")
    module.__spec__ = importlib.machinery.ModuleSpec(name, None)
    module.__all__ = list(target.__all__)  # type: ignore[attr-defined]
    sys.modules[name] = module
    setattr(importlib.import_module(parent), child, module)
    for key in target.__all__:
        obj = getattr(target, key)
        alias(obj, key, name, new=f"{new}.{key}" if callable(obj) else None, why=why)
    return module
