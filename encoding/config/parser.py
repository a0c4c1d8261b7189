"""The command-line parsers of ``train.py``, ``test.py`` and ``demo.py`` (and of the tools ``python -m
encoding.memory`` / ``python -m encoding.export``), generated from the option fields.

Every option of a parser is a field of :mod:`.groups` (:func:`option_specs` lists them); nothing here restates a
type, a choice or a default. The parsers leave an option that is not given unset (``argparse.SUPPRESS``), so
:func:`~.resolve.resolve` knows what the command line (or a configuration file, read through the same parser) set,
and fills the rest in its one documented order; ``--help`` shows each field's default. A tool's parser
(:data:`~.tools.TOOLS`) fills each option it is not given with the field's default for the tool.
"""
from __future__ import annotations

import argparse
import sys
import warnings
from dataclasses import Field
from typing import Any, Dict, Iterator, List, Sequence, Tuple

from ..utils.cli import TRACEBACK_ENV, TRACEBACK_FLAG, OneLineParser
from .fields import SCRIPTS, Option, cli_name, option_fields
from .groups import GROUPS
from .tools import TOOL_GROUPS, TOOLS

__all__ = ["TITLES", "PROGS", "option_specs", "build_parser", "warn_old_spellings"]

TITLES = {"train": "Train / evaluate a segmentation model (encoding)",
          "test": "Evaluate a segmentation model on a dataset split (encoding)",
          "demo": "Segment images: coloured mask and overlay PNGs (encoding)",
          "memory": "Peak memory per device of a training step under gather (nn.DataParallel), balanced "
                    "(DataParallelModel + DataParallelCriterion), balanced-auto and ddp; simulated with --simulate N "
                    "(no GPU needed) or measured on --devices.",
          "export": "Export a trained network (torch.export, or ONNX) with its metadata (encoding)",
          "app": "A web page (Gradio, pip install -e '.[app]') that segments images with a trained network and plans "
                 "memory with the memory tool (encoding)"}
#: How each parser names its program (a script: ``<script>.py``).
PROGS = {**{script: f"{script}.py" for script in SCRIPTS}, **{tool: f"python -m encoding.{tool}" for tool in TOOLS}}
#: ``train.py --config FILE``: the one option that is not a setting of the run (it names where settings come from).
CONFIG_HELP = ("YAML/JSON file of options (keys: option names); the command line's options win; a run saves its own "
               "as config.yaml (docs/configs.md)")


#: ``--traceback``: the one option of every parser that is not a setting (it says how an error is shown).
TRACEBACK_HELP = (f"print the whole traceback of a one-line error too (or set {TRACEBACK_ENV}=1); an unexpected error "
                  "always shows it")


def option_specs(script: str) -> Iterator[Tuple[Field, Option]]:
    """``(field, option)`` of every option of ``script``, in ``--help`` order.

    Raises:
        ValueError: an unknown script.
    """
    if script not in PROGS:
        raise ValueError(f"unknown script {script!r}; valid: {', '.join(PROGS)}")
    return ((f, o) for f, o in option_fields(*_groups().values()) if script in o.scripts)


def _groups() -> Dict[str, type]:
    """Every group of option fields, by ``--help`` section name: the scripts' and the tools'."""
    return {**GROUPS, **TOOL_GROUPS}


def _arguments(f: Field, o: Option, script: str) -> Tuple[List[str], Dict[str, Any]]:
    """The option strings and argparse keywords of the field ``f`` in ``script``."""
    spelling = dict(o.per_script.get(script, {}))
    flags = list(spelling.pop("flags", o.flags or (cli_name(f.name),)))
    default = spelling.pop("default", f.default)
    kwargs: Dict[str, Any] = dict(help=o.help, default=default if script in TOOLS else argparse.SUPPRESS)
    if isinstance(default, bool) and o.nargs is None and "choices" not in spelling:
        kwargs["action"] = "store_true"
    else:
        kwargs.update(type=o.parse or _scalar(default), choices=o.choices, metavar=o.metavar, nargs=o.nargs)
        if o.nargs == "?":
            kwargs["const"] = o.const
    kwargs.update(spelling)
    if not flags[0].startswith("-"):  # a positional: always given
        kwargs.pop("default")
        kwargs["type"] = None
    elif kwargs["help"] != argparse.SUPPRESS and default not in (None, False, ()) and not _filled(o, script) \
            and "default" not in kwargs["help"]:
        kwargs["help"] += f" [{_shown(default)}]"
    if kwargs.get("type") is None:
        kwargs.pop("type", None)
    if o.old:
        flags.append(o.old)
    return flags, {"dest": f.name, **kwargs} if flags[0].startswith("-") else kwargs


def _filled(o: Option, script: str) -> bool:
    """Whether a source other than the default fills the option: the recipe, or the weights of test/demo."""
    return o.recipe or o.network and script != "train"


def _scalar(default: Any) -> Any:
    """The argparse ``type`` of a field without ``parse``: its default's (text when the default is ``None``)."""
    return type(default) if isinstance(default, (int, float)) and not isinstance(default, bool) else None


def _shown(value: Any) -> str:
    return ",".join(str(v) for v in value) if isinstance(value, tuple) else str(value)


def build_parser(script: str = "train") -> argparse.ArgumentParser:
    """The argument parser of ``experiments/segmentation/<script>.py`` (``train``, ``test`` or ``demo``), or of the
    tool ``python -m encoding.<script>`` (``memory``, ``export``): one argument per option field of the script;
    what is not given stays unset (a tool's: its default).

    Raises:
        ValueError: an unknown script.
    """
    specs = list(option_specs(script))  # checks the name
    parser = OneLineParser(prog=PROGS[script], description=TITLES[script])
    for name, group in _groups().items():  # one --help section per group of fields
        fields = [(f, o) for f, o in option_fields(group) if (f, o) in specs]
        summary = (group.__doc__ or "").strip().splitlines()[0].replace("``", "").rstrip(".")
        title = f"{name}: {summary}" if script in SCRIPTS or name == script else name  # the others speak of scripts
        section = parser.add_argument_group(title) if fields else None
        for f, o in fields:
            flags, kwargs = _arguments(f, o, script)
            section.add_argument(*flags, **kwargs)
    if script == "train":
        parser.add_argument("--config", metavar="FILE", default=argparse.SUPPRESS, help=CONFIG_HELP)
    # how errors are shown, not a setting (run_cli takes it out of argv before the parser sees it): listed for --help
    parser.add_argument(TRACEBACK_FLAG, action="store_true", default=argparse.SUPPRESS, help=TRACEBACK_HELP)
    return parser


def warn_old_spellings(script: str, argv: Sequence[str], where: str = "the command line") -> None:
    """A ``FutureWarning`` (and one line on stderr) for each old spelling in ``argv`` (e.g. ``--checkpoint``, now
    ``--recompute``)."""
    for f, o in option_specs(script):
        if o.old and any(a == o.old or a.startswith(o.old + "=") for a in argv):
            message = f"{o.old} is now {cli_name(f.name)} ({where}); the old spelling will go"
            warnings.warn(message, FutureWarning, stacklevel=3)
            sys.stderr.write(f"{PROGS[script]}: note: {message}\n")
