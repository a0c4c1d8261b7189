"""Configuration files of a script: YAML (PyYAML) or JSON files whose keys are the script's option names.

A file holds one mapping: ``crop-size: 512`` (``crop_size`` too) for ``--crop-size 512``, ``aux: true`` for the flag
``--aux``, a list for a comma-separated option (``scale-range: [0.5, 2.0]``); ``null`` or ``false`` leave an option
at its default. :func:`config_argv` turns the file into the command-line tokens the script's own
``argparse`` parser reads, so a file's values are typed and checked exactly as the same options on the command line
(one validation path); :func:`expand_config` puts them before the command line's own options, which therefore win.
:func:`write_config` writes a run's effective options in the same format (readable back with :func:`read_config`).
"""
from __future__ import annotations

import argparse
import difflib
import json
import os
import reprlib
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from ..errors import UsageError
from .cli import arg, make_parser
from .files import atomic_write

__all__ = ["ConfigFileError", "read_config", "config_argv", "parse_config", "expand_config", "write_config"]


class ConfigFileError(UsageError):
    """A configuration file that cannot be used: one line naming the file (and the key or value, exit status 2)."""


#: The largest configuration file read (bytes); a script's options fit in a few KiB.
MAX_BYTES = 1 << 20
#: The most values (mappings, lists and scalars, YAML aliases counted each time they are used) and the deepest
#: nesting a file may expand to: bounds what a file of nested aliases ("billion laughs") costs.
MAX_VALUES, MAX_DEPTH = 10_000, 20

_short = reprlib.Repr()
_short.maxstring, _short.maxother, _short.maxlist, _short.maxdict, _short.maxlevel = 60, 60, 6, 6, 3


def _brief(value: Any) -> str:
    """A bounded ``repr`` of a value for an error message (long strings, lists and nesting elided)."""
    return _short.repr(value)


def _clip(text: str, limit: int = 300) -> str:
    """``text`` cut to ``limit`` characters (an error message stays one readable line)."""
    return text if len(text) <= limit else text[:limit] + "..."


def _check_expansion(data: Any, path: str) -> None:
    """Refuse a file whose values expand (aliases repeated) past :data:`MAX_VALUES` or nest past :data:`MAX_DEPTH`,
    counting without expanding anything."""
    stack, count = [(data, 0)], 0
    while stack:
        value, depth = stack.pop()
        count += 1
        if count > MAX_VALUES:
            raise ConfigFileError(f"{path}: expands to more than {MAX_VALUES} values (nested aliases?); a "
                                  "configuration file holds a script's options")
        if depth > MAX_DEPTH:
            raise ConfigFileError(f"{path}: nested deeper than {MAX_DEPTH} levels; a configuration file holds a "
                                  "script's options")
        if isinstance(value, dict):
            stack.extend((v, depth + 1) for v in value.values())
            stack.extend((k, depth + 1) for k in value if isinstance(k, (tuple, list, dict)))
        elif isinstance(value, (list, tuple)):
            stack.extend((v, depth + 1) for v in value)


def _read_text(path: str) -> str:
    """The file's text (UTF-8), refusing a file larger than :data:`MAX_BYTES` or one that is not text."""
    with open(path, "rb") as f:
        raw = f.read(MAX_BYTES + 1)
    if len(raw) > MAX_BYTES:
        raise ConfigFileError(f"{path}: larger than {MAX_BYTES // 1024} KiB; a configuration file holds a script's "
                              "options")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ConfigFileError(f"{path}: not a text file (byte {err.start} is not UTF-8)") from None


def _name(key: Any) -> str:
    """The option a file's key stands for: ``crop_size`` and ``crop-size`` are both ``crop-size``."""
    return str(key).replace("_", "-")


def _given_once(path: str, keys: Iterable[Any]) -> None:
    """Refuse a key given twice (``crop-size`` and ``crop_size`` are one option): the last one would silently win."""
    seen: Dict[str, Any] = {}
    for key in keys:
        if _name(key) in seen:
            also = "" if seen[_name(key)] == key else f" (as {_brief(seen[_name(key)])} before)"
            raise ConfigFileError(f"{path}: a key given twice: {_brief(key)}{also}; give each option once")
        seen[_name(key)] = key


def _json_mapping(text: str) -> Tuple[Any, List[Any]]:
    """``(value, top-level keys in the file's order, repeats included)`` of JSON ``text``."""
    objects: List[list] = []

    def keep(pairs: list) -> Dict[str, Any]:
        objects.append(pairs)  # the outermost object is completed last
        return dict(pairs)

    data = json.loads(text, object_pairs_hook=keep) if text.strip() else {}
    return data, [k for k, _ in objects[-1]] if isinstance(data, dict) and objects else []


def _yaml_mapping(yaml: Any, text: str) -> Tuple[Any, List[Any]]:
    """``(value, top-level keys in the file's order, repeats included)`` of YAML ``text`` (one parse: PyYAML's
    ``safe_load`` keeps the last of repeated keys; a ``<<`` merge's keys may be overridden, as YAML defines)."""
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        pairs = node.value if isinstance(node, yaml.MappingNode) else []
        keys = [k.value for k, _ in pairs if isinstance(k, yaml.ScalarNode) and k.tag != "tag:yaml.org,2002:merge"]
        return (loader.construct_document(node) if node is not None else None), keys
    finally:
        loader.dispose()


def read_config(path: str) -> Dict[str, Any]:
    """The mapping of the YAML (``.yaml`` / ``.yml``, needs PyYAML) or JSON (``.json``) file ``path``.

    Raises:
        ConfigFileError: no such file, another extension, PyYAML missing, a syntax error, not a mapping, not UTF-8
            text, larger than :data:`MAX_BYTES`, expanding past :data:`MAX_VALUES` values / :data:`MAX_DEPTH`
            levels, or a key given twice (``crop-size`` and ``crop_size`` are one).
    """
    ext = os.path.splitext(path)[1].lower()
    if ext not in (".yaml", ".yml", ".json"):
        raise ConfigFileError(f"{path}: a configuration file is .yaml, .yml or .json, got {ext or 'no extension'!r}")
    if not os.path.isfile(path):
        raise ConfigFileError(f"{path}: no such configuration file")
    text = _read_text(path)
    if ext == ".json":
        try:
            data, keys = _json_mapping(text)
        except ValueError as err:
            raise ConfigFileError(f"{path}: not valid JSON ({err})") from None
        except RecursionError:
            raise ConfigFileError(f"{path}: nested too deeply") from None
    else:
        try:
            import yaml
        except ImportError:
            raise ConfigFileError(f"{path}: reading YAML needs PyYAML: pip install -e .[config] "
                                  "(or write the file as .json)") from None
        try:
            data, keys = _yaml_mapping(yaml, text)
        except yaml.YAMLError as err:
            raise ConfigFileError(f"{path}: not valid YAML ({_clip(' '.join(str(err).split()))})") from None
        except RecursionError:
            raise ConfigFileError(f"{path}: nested too deeply") from None
        except (ValueError, TypeError) as err:  # a value PyYAML cannot construct
            raise ConfigFileError(f"{path}: not a usable YAML file ({_clip(str(err))})") from None
    data = {} if data is None else data
    _check_expansion(data, path)
    if not isinstance(data, dict):
        raise ConfigFileError(f"{path}: expected a mapping of option names to values, got {type(data).__name__}")
    _given_once(path, keys)
    return data


def _options(parser: argparse.ArgumentParser) -> Dict[str, argparse.Action]:
    """Every long option of ``parser`` by its name without dashes (``crop-size``), and by its ``dest``."""
    options: Dict[str, argparse.Action] = {}
    for action in parser._actions:  # argparse lists its options only there
        longs = [s[2:] for s in action.option_strings if s.startswith("--")]
        if not longs or isinstance(action, argparse._HelpAction) or action.help == argparse.SUPPRESS:
            continue
        for name in longs + [action.dest]:
            options.setdefault(_name(name), action)
    return options


def _tokens(action: argparse.Action, value: Any, where: str) -> List[str]:
    """The command-line tokens of ``value`` for ``action`` (``[]``: leave the option at its default); a value
    starting with ``-`` is one ``--option=value`` token (as two, argparse would read it as an option)."""
    option = next(s for s in action.option_strings if s.startswith("--"))
    if value is None:
        return []
    if action.nargs == 0:  # a flag
        if not isinstance(value, bool):
            raise ConfigFileError(f"{where}: {option} is a switch: expected true or false, got {_brief(value)}")
        return [option] if value != bool(action.const is False) else []
    if action.nargs == argparse.OPTIONAL and isinstance(value, bool):  # --option [VALUE]: true is the bare option
        return [option] if value else []
    if isinstance(value, bool) or isinstance(value, (dict, list, tuple)) and not value:
        raise ConfigFileError(f"{where}: {option} takes a value, got {_brief(value)}")
    if isinstance(value, (list, tuple)):
        if any(isinstance(v, (dict, list, tuple, bool)) or v is None for v in value):
            raise ConfigFileError(f"{where}: {option}: expected a list of numbers or words, got {_brief(value)}")
        value = ",".join(str(v) for v in value)
    elif isinstance(value, dict):
        raise ConfigFileError(f"{where}: {option}: expected a value, got a mapping")
    return [f"{option}={value}"] if str(value).startswith("-") else [option, str(value)]


#: Options a file may not set, and why: they are about the command, not the run.
NOT_IN_FILES = {"config": "a file does not name another file",
                "traceback": "it is how errors are shown: --traceback on the command line, or ENCODING_TRACEBACK=1",
                "trust-code": "a file cannot opt in for itself: --trust-code on the command line"}
#: Keys of :data:`NOT_IN_FILES` a file may hold turned off (``false`` / ``null``: the default, as a run's written
#: options record them); refused when they would turn the option on.
OFF_IN_FILES = ("trust-code",)


def config_argv(parser: argparse.ArgumentParser, path: str, data: Optional[Mapping[str, Any]] = None,
                exclude: Sequence[str] = tuple(NOT_IN_FILES)) -> List[str]:
    """The command-line tokens that the file ``path`` stands for, in the file's order.

    Args:
        parser: the script's parser (its long options are the valid keys).
        data: the file's mapping when already read.
        exclude: keys a file may not set (:data:`NOT_IN_FILES`; those of :data:`OFF_IN_FILES` may be off).

    Raises:
        ConfigFileError: an unknown key (naming the closest option), a key given twice (``crop-size`` and
            ``crop_size``), a key of ``exclude`` that sets its option, or a value of the wrong shape.
    """
    data = read_config(path) if data is None else data
    _given_once(path, data)
    options = _options(parser)
    argv: List[str] = []
    for key, value in data.items():
        name, where = _name(key), f"{path}: key {_brief(key)}"
        if name in exclude and name in options:
            if name in OFF_IN_FILES and not _tokens(options[name], value, where):
                continue  # off, the default: the command line alone turns it on
            why = NOT_IN_FILES.get(name, "the command line's")
            raise ConfigFileError(f"{path}: key {_brief(key)} cannot be set in a file ({why})")
        if name not in options or name in exclude:
            close = difflib.get_close_matches(name, [o for o in options if o not in exclude], n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ConfigFileError(f"{path}: unknown key {_brief(key)}{hint} (keys are {parser.prog}'s options "
                                  "without the leading dashes)")
        argv += _tokens(options[name], value, where)
    return argv


def parse_config(parser: argparse.ArgumentParser, path: str) -> argparse.Namespace:
    """The options of the file ``path`` alone, parsed by ``parser`` (unset options keep their defaults).

    Raises:
        ConfigFileError: as :func:`config_argv`, or a value the option refuses (naming the file).
    """
    argv = config_argv(parser, path)
    exit_on_error, parser.exit_on_error = parser.exit_on_error, False
    try:
        return parser.parse_args(argv)
    except argparse.ArgumentError as err:
        raise ConfigFileError(f"{path}: {_clip(str(err))}") from None
    finally:
        parser.exit_on_error = exit_on_error


def expand_config(parser: argparse.ArgumentParser, argv: Sequence[str]) -> List[str]:
    """``argv`` with the options of its ``--config FILE`` put first (so that the command line's own win).

    The file's options are checked on their own first, so that a bad value names the file.

    Raises:
        ConfigFileError: see :func:`parse_config`.
    """
    path = make_parser(parser.prog, (arg("--config"),), add_help=False).parse_known_args(list(argv))[0].config
    if path is None:
        return list(argv)
    parse_config(parser, path)
    return config_argv(parser, path) + list(argv)


def _value(value: Any) -> str:
    """A YAML value that reads back as ``value`` (JSON's spelling of scalars and lists is valid YAML)."""
    return json.dumps(list(value) if isinstance(value, tuple) else value)


def write_config(path: str, options: Mapping[str, Any], header: str = "") -> str:
    """Write ``options`` (option ``dest`` -> value) as a configuration file at ``path``, atomically.

    The keys are the option names (``crop-size``), one per line, in ``options``' order; ``header`` becomes comment
    lines at the top. Needs no PyYAML: each value is written in JSON's spelling, which YAML reads the same.
    """
    lines = [f"# {line}".rstrip() for line in header.splitlines()]
    lines += [f"{key.replace('_', '-')}: {_value(value)}" for key, value in options.items()]
    atomic_write(path, "\n".join(lines) + "\n")
    return path
