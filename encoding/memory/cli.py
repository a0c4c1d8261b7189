"""The memory tool's command line: ``python -m encoding.memory`` (``scripts/memory_balance.py`` wraps it).

Runs training steps of a segmentation model under each strategy — ``gather`` (``torch.nn.DataParallel``),
``balanced`` (:class:`~encoding.parallel.DataParallelModel` + :class:`~encoding.parallel.DataParallelCriterion`),
``balanced-auto`` (the same with the split of :func:`~encoding.memory.balance.plan_split`) and ``ddp`` — and
reports each device's peak memory: simulated for ``--simulate N`` virtual devices (no GPU needed, see
:mod:`encoding.memory.simulate`), or measured with ``torch.cuda.max_memory_allocated`` on ``--devices``. Writes a
table, a JSON file and (with matplotlib) a PNG bar chart (:mod:`encoding.memory.report`). See ``docs/memory.md``.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from typing import Any, Dict, List, Optional, Sequence, Set

import torch

from ..config.parser import build_parser as config_parser, warn_old_spellings
from ..config.tools import DEFAULT_MEMORY_LIMIT, DEFAULT_RESERVE
from ..datasets.folder_meta import CLASS_FILES
from ..errors import UsageError
from ..names import is_model_spec
from ..utils.cli import run_cli
from ..utils.files import refuse_own_input
from .planner import parse_memory
from .program import MEMORY_STRATEGIES
from .report import format_report, memory_report, write_chart, write_json

__all__ = ["MAX_SIMULATED_DEVICES", "parse_memory", "build_parser", "parse_args", "main", "cli"]

#: The most devices ``--simulate`` takes: past it the device lists themselves (a ``zero1`` partition and an ``fsdp``
#: shard per rank and parameter) cost more than the simulation, and no data-parallel job runs that wide.
MAX_SIMULATED_DEVICES = 16384
#: The options that take a memory size (a negative one is read as a size, to be refused as one, not as an option).
SIZE_OPTIONS = ("--memory-limit", "--reserve")


# ------------------------------------------------------------------------------------------------ options
def build_parser() -> argparse.ArgumentParser:
    """The options of ``python -m encoding.memory`` (``scripts/memory_balance.py``): generated from the option fields
    of :mod:`encoding.config` (:class:`~encoding.config.tools.MemoryOptions` and the ones shared with ``train.py``)."""
    return config_parser("memory")


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    """Parse and check the options; every bad value ends in a one-line argparse error (exit 2)."""
    parser = build_parser()
    given = sys.argv[1:] if argv is None else list(argv)
    args = parser.parse_args(_signed_sizes(given))
    warn_old_spellings("memory", given)
    try:
        _complete(args)
        _check_read(args, {k for k, v in vars(args).items() if k in _READ_WHEN and v != parser.get_default(k)})
    except ValueError as exc:
        parser.error(str(exc))
    return args


#: Options the tool reads only in some runs: option -> (whether this run reads it, when it does).
_READ_WHEN = {
    "steps": (lambda a: a.devices is not None, "--devices (real GPUs)"),
    "seed": (lambda a: a.devices is not None or a.calibrate, "--devices or --calibrate (real steps)"),
    "backend": (lambda a: a.devices is None and "fsdp" in a.strategies, "simulated fsdp"),
    "reserve": (lambda a: a.advise, "--advise"),
    "data_root": (lambda a: a.dataset == "folder", "--dataset folder (its class file)"),
    "backbone": (lambda a: not is_model_spec(a.model), "a network of the toolkit's (not a model spec)"),
    "momentum": (lambda a: a.optimizer == "sgd", "--optimizer sgd"),
    "out_dir": (lambda a: not (a.json and a.chart), "--json or --chart left out (it holds the file they do not name)"),
}


def _check_read(args: argparse.Namespace, given: Set[str]) -> None:
    """Refuse an option given where this run never reads it (it would change nothing)."""
    for name in sorted(given):
        reads, when = _READ_WHEN[name]
        if not reads(args):
            raise ValueError(f"--{name.replace('_', '-')} is read only with {when}; this run would not use it")


def _signed_sizes(argv: List[str]) -> List[str]:
    """``--memory-limit -5GiB`` as ``--memory-limit=-5GiB`` (argparse takes ``-5GiB`` for an option and says only
    "expected one argument"); the size's own check then refuses it."""
    out: List[str] = []
    for item in argv:
        if out and out[-1] in SIZE_OPTIONS and item[:1] == "-" and item[1:2].isdigit():
            out[-1] = f"{out[-1]}={item}"
        else:
            out.append(item)
    return out


def _complete(args: argparse.Namespace) -> None:
    from ..datasets import datasets

    strategies = [s.strip() for s in args.strategies.split(",") if s.strip()]
    unknown = [s for s in strategies if s not in MEMORY_STRATEGIES]
    if unknown or not strategies:
        raise ValueError(f"--strategies: unknown {', '.join(map(repr, unknown)) or 'empty list'}; "
                         f"valid: {', '.join(MEMORY_STRATEGIES)}")
    args.strategies = strategies
    if args.devices is not None and args.simulate is not None:
        raise ValueError("--devices measures real GPUs and --simulate N simulates; give one of them")
    if args.devices is not None:
        args.device_list = _cuda_devices(args.devices)
    elif args.simulate is None:
        args.simulate = 4
    if args.simulate is not None and args.simulate > MAX_SIMULATED_DEVICES:
        raise ValueError(f"--simulate {args.simulate}: the planner simulates at most {MAX_SIMULATED_DEVICES} devices")
    count = args.simulate if args.devices is None else len(args.device_list)
    if args.dataset not in datasets:
        raise ValueError(f"--dataset: unknown {args.dataset!r}; valid: {', '.join(datasets)}")
    args.nclass = _class_count(args) if args.nclass is None else args.nclass
    _recipe_network(args)
    parameter_bytes = _check_network(args)
    if args.batch_size is None:
        args.batch_size = 2 * count
    if args.batch_size < count:
        raise ValueError(f"--batch-size {args.batch_size} is smaller than the {count} devices: every device needs "
                         "a sample to compare strategies")
    if args.advise and args.devices is not None:
        raise ValueError("--advise simulates; use it with --simulate N, not --devices")
    if args.amp == "auto":
        args.amp = "fp16" if args.devices is not None else "bf16"
    if args.memory_limit is None and (args.max_batch or args.advise):
        args.memory_limit = DEFAULT_MEMORY_LIMIT
    try:
        args.memory_limit_bytes = (None if args.memory_limit is None
                                   else parse_memory(args.memory_limit, per_device=True))
    except ValueError as exc:
        raise ValueError(f"--memory-limit: {exc}") from None
    args.reserve_bytes = _reserve(args.reserve)
    args.num_devices = count
    _check_budget(args, parameter_bytes)
    args.json_path = args.json or os.path.join(args.out_dir, "memory_balance.json")
    args.chart_path = args.chart or os.path.join(args.out_dir, "memory_balance.png")


def _check_budget(args: argparse.Namespace, parameter_bytes: int) -> None:
    """Before any simulation: ``--advise`` needs a ``--reserve`` smaller than ``--memory-limit``, and the searches
    (``--advise``, ``--max-batch``: allocations only) a budget above the parameters' share of a device (no device
    holds less: ``fsdp`` shards them over every device, the others hold them whole)."""
    if args.advise and args.reserve_bytes >= args.memory_limit_bytes:
        default = " (its default)" if args.reserve == DEFAULT_RESERVE else ""
        raise ValueError(f"--reserve {args.reserve}{default} is not smaller than --memory-limit {args.memory_limit}: "
                         "the advice would have nothing to fit; give a smaller --reserve (0B: none)")
    share = parameter_bytes / args.num_devices
    if (args.advise or args.max_batch) and args.memory_limit_bytes - args.advise * args.reserve_bytes < share:
        size = f"{share / 2 ** 20:.1f} MiB" if share >= 2 ** 20 else f"{share / 2 ** 10:.1f} KiB"
        raise ValueError(f"--memory-limit {args.memory_limit}: nothing fits: the network's parameters alone take "
                         f"{size} per device even sharded over the {args.num_devices} devices")


def check_outputs(args: argparse.Namespace) -> None:
    """At the start of the work (parsing looks at no file): the report's files (and ``--timeline``'s) can be
    written, are distinct, and none is a file the run reads (a ``--dataset folder``'s class file, an image, mask or
    split list under its ``--data-root``).

    Raises:
        UsageError: a folder, an unwritable place, one file for two outputs or an input (naming the option).
    """
    outputs = [("--json" if args.json else "--out-dir", args.json_path),
               ("--chart" if args.chart else "--out-dir", args.chart_path)]
    if getattr(args, "timeline", None):  # its folder's files (encoding.memory.timeline.write_timeline)
        outputs += [("--timeline", os.path.join(args.timeline, name)) for name in TIMELINE_FILES]
    root = args.data_root if args.dataset == "folder" and args.data_root else None
    try:
        for option, path in outputs:
            _check_writable(option, path)
        refuse_own_input(outputs, [read for _, path in outputs for read in _inputs(root, path)])
    except ValueError as err:
        raise UsageError(str(err)) from None


#: The files ``--timeline DIR`` writes in ``DIR``.
TIMELINE_FILES = ("timeline.json", "timeline.png", "timeline.html")


def _inputs(root: Optional[str], output: str) -> List[str]:
    """The files of a ``--data-root root`` that ``output`` could destroy: its class files, and ``output`` itself
    where it is a file under ``root`` that the folder dataset reads (an image, a mask, a split list)."""
    if root is None:
        return []
    from ..utils.images import image_extensions

    real = os.path.realpath(root)
    read = os.path.splitext(output)[1].lower() in image_extensions() | {".txt"}
    inside = read and os.path.isfile(output) and os.path.commonpath([real, os.path.realpath(output)]) == real
    return [os.path.join(root, name) for name in CLASS_FILES] + ([output] if inside else [])


def _class_count(args: argparse.Namespace) -> int:
    """The dataset's class count; a ``folder`` dataset's read from ``--data-root`` as training reads it (its class
    file, else the scan of its masks: :class:`~encoding.datasets.FolderSegmentation`)."""
    from ..datasets import datasets
    from ..datasets.metadata import dataset_metadata

    if args.dataset != "folder":
        return datasets[args.dataset].NUM_CLASS
    if not args.data_root:
        raise ValueError("--dataset folder: give --data-root DIR (its classes give the class count) or --nclass N")
    return len(dataset_metadata(datasets["folder"](root=args.data_root, split="train"))["classes"])


def _recipe_network(args: argparse.Namespace) -> None:
    """What ``train.py`` takes from the dataset's recipe, for what the command line leaves unset: the crop (else the
    dataset's own), and for the recipe's own model its output stride and head width
    (:func:`~encoding.config.resolve.recipe_defaults`): the tool plans the network and crop training runs."""
    from ..config.resolve import recipe_defaults
    from ..datasets import datasets

    recipe = recipe_defaults(args.dataset, args.model)
    for name in ("output_stride", "head_channels", "crop_size"):
        if getattr(args, name) is None:
            setattr(args, name, recipe.get(name))
    if args.crop_size is None:
        args.crop_size = datasets[args.dataset].CROP_SIZE


def _check_network(args: argparse.Namespace) -> int:
    """Fail before any work on a network the simulation cannot build (:meth:`NetworkSpec.check
    <encoding.models.network.NetworkSpec.check>`: built on the ``meta`` device, no memory, no weights); returns the
    bytes of its parameters."""
    from ..models.network import NetworkSpec

    return NetworkSpec.from_options(args, args.nclass).parameter_bytes()


def _reserve(text: str) -> int:
    """``--reserve``: a memory size, or zero (``0B``, ``0``)."""
    if text.strip().upper() in ("0", "0B"):
        return 0
    try:
        return parse_memory(text)
    except ValueError as exc:
        raise ValueError(f"--reserve: {exc}") from None


def _check_writable(option: str, path: str) -> None:
    """Fail before any work when ``path`` cannot be written: it is a directory, a file stands where its folder
    would be, or no file can be made in the nearest existing folder (tried: permissions alone do not tell, e.g.
    under ``/proc`` or on a read-only mount)."""
    if os.path.isdir(path):
        raise ValueError(f"{option}: {path!r} is a directory; give a file path")
    folder = os.path.dirname(os.path.abspath(path))
    existing = folder
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise ValueError(f"{option}: cannot write {path!r}: {existing!r} is a file, not a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ValueError(f"{option}: cannot write {path!r}: the folder {existing!r} is not writable")
    try:
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as err:
        raise ValueError(f"{option}: cannot write {path!r}: no file can be made in {existing!r} "
                         f"({err.strerror or type(err).__name__})") from None


def _cuda_devices(text: str) -> List[int]:
    try:
        indices = [int(item) for item in text.split(",") if item.strip()]
    except ValueError:
        raise ValueError(f"--devices must be comma-separated CUDA indices such as 0,1,2,3, got {text!r}") from None
    available = torch.cuda.device_count() if torch.cuda.is_available() else 0
    bad = [i for i in indices if not 0 <= i < available]
    if not indices or bad:
        raise ValueError(f"--devices {text!r}: this machine has {available} CUDA device(s); without a GPU use "
                         "--simulate N")
    return indices


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    """Entry point of ``python -m encoding.memory`` (and ``scripts/memory_balance.py``): print the table, write
    JSON and chart; return the report."""
    args = parse_args(argv)
    check_outputs(args)
    if args.timeline:  # the memory over one step, from the same simulation (encoding.memory.timeline)
        from .timeline import check_options
        check_options(args)
    report = memory_report(args, ahead=True)
    print(format_report(report))
    write_json(report, args.json_path)
    print(f"wrote {args.json_path}")
    if write_chart(report, args.chart_path):
        print(f"wrote {args.chart_path}")
    if args.timeline:
        from .timeline import write_report_timeline
        print("\n".join(f"wrote {path}" for path in write_report_timeline(args, report)))
    return report


def cli(argv: Optional[Sequence[str]] = None) -> int:
    """``main`` for the command line: an ``EncodingError`` is one line on stderr, a bug keeps its traceback
    (``--traceback`` shows them all); returns the exit status."""
    return run_cli("python -m encoding.memory", main, argv)
