"""Loading someone's model runs no code of theirs: the one rule, and the one gate every import of named code passes.

A model folder, a Hub repository or a checkpoint records how to rebuild its network. What it records may name code:
a ``package.module:factory`` model spec (imported, then called) or a dataset class path ``module:QualName``
(imported). That code is the author's, not the user's: like Hugging Face's ``trust_remote_code``, it is imported only
when the user opts in (``trust_code=True`` in Python, ``--trust-code`` on the command lines). Registry architectures
and the built-in ``torchvision:`` / ``transformers:`` architectures name no code (the weights are safetensors or
``weights_only`` state dicts), nor do the package's own dataset classes (``encoding.datasets``; any other module of
the package, a tool's ``__main__`` above all, is named code like anyone's).

* :func:`reading` marks the code that runs while data from a source is read: inside ``reading(source,
  trust_code=False)`` every :func:`allow_import` of named code raises :class:`UntrustedCode`;
* :func:`check_trusted` refuses options that name code before any work, in one line naming the module and the opt-in;
* outside :func:`reading`, code is the user's own request (``train.py --model my.mod:build``,
  ``get_segmentation_model("my.mod:build")``) and is imported.

This module imports nothing of the package but its errors.
"""
from __future__ import annotations

import contextlib
from contextvars import ContextVar
from typing import Any, Iterator, List, Mapping, Optional, Tuple

from ..errors import UsageError
from ..names import names_code

__all__ = ["UntrustedCode", "OPT_IN", "names_code", "code_named", "reading", "untrusted_source", "allow_import",
           "check_trusted"]

#: How a user opts in, in Python and on the command lines.
OPT_IN = "trust_code=True (command line: --trust-code)"
#: The source read without the user's opt-in (``None``: none, or trusted).
_UNTRUSTED: ContextVar[Optional[str]] = ContextVar("encoding_untrusted_source", default=None)


class UntrustedCode(UsageError):
    """Data (a model folder, a Hub repository, a checkpoint, a web request) names code to import and the caller did
    not opt in (``trust_code=True`` / ``--trust-code``); exit status 2."""


def _own(module: str) -> bool:
    """Whether ``module`` holds the package's own dataset classes: ``encoding.datasets`` or below it, never a
    ``__main__`` (importing a tool's entry point runs the tool). Any other module of the package is named code too:
    data has no reason to import it."""
    parts = module.split(".")
    return parts[:2] == ["encoding", "datasets"] and "__main__" not in parts


def code_named(options: Mapping[str, Any]) -> List[Tuple[str, str]]:
    """``(what, module)`` of each piece of code that network / data ``options`` name: a ``module:factory`` model spec
    (``model``) and a dataset class path that is not the package's own (``dataset_class``)."""
    named = []
    model = options.get("model")
    if names_code(model):
        named.append((f"the model spec {model!r}", model.partition(":")[0]))
    path = options.get("dataset_class")
    if isinstance(path, str) and path and not _own(path.partition(":")[0]):
        named.append((f"the dataset class {path!r}", path.partition(":")[0]))
    elif path is not None and not isinstance(path, str):
        named.append((f"the dataset class {str(repr(path))[:60]}", "?"))
    return named


def _message(source: str, what: str, module: str) -> str:
    return (f"{source} names code to run: {what} imports the module {module!r}; loading a model runs no code of its "
            f"author's unless you trust it: pass {OPT_IN}")


@contextlib.contextmanager
def reading(source: str, trust_code: bool) -> Iterator[None]:
    """While data from ``source`` is read: code it names is imported only with ``trust_code``
    (:func:`allow_import` refuses it otherwise). Nested calls: the innermost decides."""
    token = _UNTRUSTED.set(None if trust_code else source)
    try:
        yield
    finally:
        _UNTRUSTED.reset(token)


def untrusted_source() -> Optional[str]:
    """The source being read without the user's opt-in (inside :func:`reading`), else ``None``."""
    return _UNTRUSTED.get()


def allow_import(module: str, what: str, trust_code: Optional[bool] = None, source: str = "the data") -> None:
    """The gate before importing ``module`` because data named it (``what``: e.g. ``"the model spec 'a.b:c'"``).

    Args:
        trust_code: ``True``: import; ``False``: refuse (naming ``source``); ``None``: as the enclosing
            :func:`reading` says (outside one: the user's own request, imported).

    Raises:
        UntrustedCode: one line naming the source, the module and the opt-in.
    """
    if _own(module) or trust_code is True:
        return
    untrusted = source if trust_code is False else _UNTRUSTED.get()
    if untrusted is not None:
        raise UntrustedCode(_message(untrusted, what, module))


def check_trusted(options: Mapping[str, Any], source: str, trust_code: bool) -> None:
    """Refuse, before any work, options read from ``source`` that name code (:func:`code_named`) unless
    ``trust_code``.

    Raises:
        UntrustedCode: one line naming the source, the first module and the opt-in.
    """
    named = code_named(options)
    if named and not trust_code:
        raise UntrustedCode(_message(source, *named[0]))
