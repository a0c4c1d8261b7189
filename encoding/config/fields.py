"""One option = one dataclass field: :func:`option` puts an option's help, parser, choices and spelling in the
field's metadata, so the command line (:mod:`.parser`), the configuration files and the run read the same place.

A field ``crop_size`` is the option ``--crop-size`` (``Option.flags`` adds other spellings, ``Option.old`` an old
one kept with a notice); its ``default`` is the library's default (:class:`~encoding.engine.assemble.TrainingConfig`'s);
``Option.scripts`` says which of ``train`` / ``test`` / ``demo`` have it, ``Option.per_script`` what one script
spells differently (another help, default or meaning).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, Mapping, Optional, Sequence, Tuple

__all__ = ["SCRIPTS", "Option", "option", "option_of", "option_fields", "cli_name", "defaults"]

#: The scripts of ``experiments/segmentation`` whose options are fields.
SCRIPTS = ("train", "test", "demo")
ALL = SCRIPTS
EVAL = ("test", "demo")


@dataclass(frozen=True)
class Option:
    """How a field is an option of the command line.

    Attributes:
        help: the ``--help`` text.
        parse: the argparse ``type`` (default: from the field's default: ``int``, ``float``, ``str``; a ``bool``
            default makes a switch).
        choices: the valid values.
        flags: more spellings besides ``--<field name>`` (aliases); ``("IMAGE",)``-like upper-case: a positional.
        old: an old spelling, still read, with a notice naming the new one (``FutureWarning``).
        scripts: the scripts that have the option.
        metavar, nargs, const: as argparse's.
        network: one of the options that define a trained network (recorded with its weights, taken from a
            checkpoint by ``test.py`` / ``demo.py``): :data:`encoding.config.NETWORK_OPTIONS`.
        recipe: one of the values a dataset's recipe file sets (:data:`encoding.config.RECIPE_KEYS`).
        recorded: ``False`` for what to do with a run directory rather than what the run is (not saved in
            ``config.yaml``).
        per_script: argparse keywords (and ``flags``) that one script replaces.
    """

    help: str
    parse: Optional[Callable[[str], Any]] = None
    choices: Optional[Sequence[Any]] = None
    flags: Tuple[str, ...] = ()
    old: Optional[str] = None
    scripts: Tuple[str, ...] = ALL
    metavar: Optional[str] = None
    nargs: Optional[str] = None
    const: Any = None
    network: bool = False
    recipe: bool = False
    recorded: bool = True
    per_script: Mapping[str, Mapping[str, Any]] = dataclasses.field(default_factory=dict)


def option(default: Any, help: str, **details: Any) -> Any:
    """A dataclass field that is an option: ``default`` and the :class:`Option` ``details``."""
    return field(default=default, metadata={"option": Option(help=help, **details)})


def option_of(f: dataclasses.Field) -> Optional[Option]:
    """The :class:`Option` of the field ``f`` (``None``: not an option)."""
    return f.metadata.get("option")


def option_fields(*groups: type) -> Iterator[Tuple[dataclasses.Field, Option]]:
    """``(field, option)`` of every option field of the dataclasses ``groups``, in order."""
    for group in groups:
        for f in dataclasses.fields(group):
            if option_of(f) is not None:
                yield f, option_of(f)


def cli_name(name: str) -> str:
    """``"crop_size"`` -> ``"--crop-size"``: a field's option on the command line."""
    return "--" + name.replace("_", "-")


def defaults(*groups: type) -> Dict[str, Any]:
    """Every option field's default of ``groups``, by name."""
    return {f.name: f.default for f, _ in option_fields(*groups)}
