"""Training logs: smoothed per-iteration values for a progress bar and one row per epoch on disk.

* :class:`SmoothedValue` / :class:`MetricLogger`: running loss, lr, time, ... with a window median and a global
  average; :meth:`MetricLogger.postfix` gives the strings for ``tqdm.set_postfix``.
* :class:`EpochLogger`: appends one row per epoch to ``log.csv`` and ``log.jsonl``, and hands its numbers (and
  preview images) to TensorBoard / Weights & Biases when requested (:mod:`.monitor`). Writes happen on the main
  process only.
* :class:`AverageMeter`: PyTorch-Encoding's simple running average.

Nothing here replaces ``print`` or touches global logging configuration.
Progress bars are made by :func:`encoding.utils.progress.progress_bar` (a bar on a terminal, plain lines when
piped), a leaf module so that :mod:`encoding.utils.files` can use it too.
"""
from __future__ import annotations

import csv
import io
import json
import math
import os
import warnings
from collections import deque
from typing import Any, Deque, Dict, Iterable, List, Mapping, Optional, Sequence, Set

import torch
from torch import Tensor

from .dist import is_main_process, reduce_across_processes
from .files import atomic_write
from .monitor import MonitorUnavailable, TensorBoardSink, WandbSink, scalars_of

__all__ = ["SmoothedValue", "MetricLogger", "AverageMeter", "EpochLogger"]


def _number(value: Any) -> float:
    if isinstance(value, Tensor):
        if value.numel() != 1:
            raise ValueError(f"expected a scalar, got a tensor of shape {tuple(value.shape)}")
        return float(value.detach().item())
    return float(value)


class SmoothedValue:
    """A series of numbers with a sliding-window median/average and a global (count-weighted) average.

    Args:
        window_size: number of recent values in the window.
        fmt: format of :meth:`__str__`, with fields ``value``, ``median``, ``avg``, ``global_avg``, ``max``.
    """

    def __init__(self, window_size: int = 20, fmt: str = "{median:.4f} ({global_avg:.4f})") -> None:
        if window_size < 1:
            raise ValueError(f"window_size must be >= 1, got {window_size}")
        self.deque: Deque[float] = deque(maxlen=window_size)
        self.total = 0.0
        self.count = 0
        self.fmt = fmt

    def update(self, value: Any, n: int = 1) -> None:
        """Add ``value`` (a number or scalar tensor) observed ``n`` times (e.g. a batch mean with ``n`` = batch)."""
        value = _number(value)
        self.deque.append(value)
        self.total += value * n
        self.count += n

    def synchronize_between_processes(self) -> None:
        """Sum ``count`` and ``total`` over processes (the window stays local). No-op when not distributed."""
        reduced = reduce_across_processes(torch.tensor([float(self.count), self.total], dtype=torch.float64))
        self.count, self.total = int(reduced[0].item()), float(reduced[1].item())

    @property
    def value(self) -> float:
        return self.deque[-1] if self.deque else math.nan

    @property
    def median(self) -> float:
        if not self.deque or any(math.isnan(v) for v in self.deque):  # NaN does not order: sorted() would lie
            return math.nan
        ordered = sorted(self.deque)
        mid = len(ordered) // 2
        return ordered[mid] if len(ordered) % 2 else 0.5 * (ordered[mid - 1] + ordered[mid])

    @property
    def avg(self) -> float:
        return sum(self.deque) / len(self.deque) if self.deque else math.nan

    @property
    def global_avg(self) -> float:
        return self.total / self.count if self.count else math.nan

    @property
    def max(self) -> float:
        if not self.deque or any(math.isnan(v) for v in self.deque):  # max() skips or keeps NaN by its position
            return math.nan
        return max(self.deque)

    def __str__(self) -> str:
        return self.fmt.format(value=self.value, median=self.median, avg=self.avg, global_avg=self.global_avg,
                               max=self.max)


class MetricLogger:
    """Named :class:`SmoothedValue` meters, created on first update.

    Example:
        >>> logger = MetricLogger()
        >>> logger.update(loss=0.5, lr=0.01)
        >>> logger.update(loss=0.3, lr=0.01)
        >>> logger.postfix()["loss"]
        '0.4000'
        >>> # with tqdm: bar.set_postfix(logger.postfix())
    """

    def __init__(self, window_size: int = 20, fmt: str = "{median:.4f}") -> None:
        self.window_size = window_size
        self.fmt = fmt
        self.meters: Dict[str, SmoothedValue] = {}

    def add_meter(self, name: str, meter: SmoothedValue) -> None:
        """Register a meter with its own window/format."""
        self.meters[name] = meter

    def update(self, n: int = 1, **values: Any) -> None:
        """Add one observation per keyword (numbers or scalar tensors), each weighted by ``n``."""
        for name, value in values.items():
            if name not in self.meters:
                self.meters[name] = SmoothedValue(self.window_size, self.fmt)
            self.meters[name].update(value, n)

    def __getitem__(self, name: str) -> SmoothedValue:
        return self.meters[name]

    def __contains__(self, name: str) -> bool:
        return name in self.meters

    def postfix(self, names: Optional[Iterable[str]] = None) -> Dict[str, str]:
        """``{name: formatted value}`` for ``tqdm.set_postfix`` (all meters, or ``names`` in that order)."""
        selected = list(self.meters) if names is None else list(names)
        return {name: str(self.meters[name]) for name in selected if name in self.meters}

    def global_averages(self) -> Dict[str, float]:
        """``{name: global average}``: the per-epoch summary to hand to :class:`EpochLogger`."""
        return {name: meter.global_avg for name, meter in self.meters.items()}

    def synchronize_between_processes(self) -> None:
        """Make the global averages cover every process (collective: call on all ranks)."""
        for name in sorted(self.meters):
            self.meters[name].synchronize_between_processes()

    def totals(self, across_processes: bool = False) -> Dict[str, List[float]]:
        """``{name: [total, count]}``: what the global averages are made of (e.g. saved in the middle of an epoch);
        ``across_processes``: summed over the processes (a collective: call on all ranks), this one's unchanged."""
        names = sorted(self.meters)
        sums = [[self.meters[n].total, float(self.meters[n].count)] for n in names]
        if across_processes and sums:
            sums = reduce_across_processes(torch.tensor(sums, dtype=torch.float64)).tolist()
        return {name: [total, count] for name, (total, count) in zip(names, sums)}

    def add_totals(self, totals: Mapping[str, Sequence[float]]) -> None:
        """Add :meth:`totals` saved earlier to the meters (created when missing): their global averages then cover
        those observations too (the window is not restored)."""
        for name, (total, count) in totals.items():
            meter = self.meters.setdefault(name, SmoothedValue(self.window_size, self.fmt))
            meter.total, meter.count = meter.total + float(total), meter.count + int(count)

    def __str__(self) -> str:
        return "  ".join(f"{name}: {meter}" for name, meter in self.meters.items())


class AverageMeter:
    """Current value and running average (PyTorch-Encoding's ``AverageMeter``)."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.val = 0.0
        self.avg = 0.0
        self.sum = 0.0
        self.count = 0

    def update(self, val: Any, n: int = 1) -> None:
        self.val = _number(val)
        self.sum += self.val * n
        self.count += n
        self.avg = self.sum / self.count


def _jsonable(value: Any) -> Any:
    """Plain JSON values: tensors/numpy become numbers or lists, NaN/inf become ``null``."""
    if isinstance(value, Tensor):
        value = value.detach().cpu().tolist()
    elif hasattr(value, "tolist") and not isinstance(value, (str, bytes)):
        value = value.tolist()  # numpy arrays and scalars
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


def _csv_cell(value: Any) -> Any:
    value = _jsonable(value)
    return json.dumps(value) if isinstance(value, (list, dict)) else ("" if value is None else value)


class EpochLogger:
    """Appends one row per epoch to ``<log_dir>/log.csv`` and ``<log_dir>/log.jsonl`` (and TensorBoard, W&B).

    Rows may gain new keys over time: the CSV is then rewritten with the extended header (old rows get empty
    cells). Resuming into an existing directory appends.

    Args:
        log_dir: directory of the files (created).
        csv_name, jsonl_name: file names (``None`` disables that file).
        tensorboard: also write the row's numbers as TensorBoard scalars (step = epoch) in ``log_dir`` when the
            ``tensorboard`` package is installed (a warning otherwise; it is not a dependency).
        wandb: also log them to an offline Weights & Biases run in ``<log_dir>/wandb`` (a warning when ``wandb``
            is not installed).
        config: the run's options, recorded by W&B.
        enabled: whether this process writes (default: only the main process under ``torch.distributed``).

    Example:
        >>> with EpochLogger("runs/shapes/fcn") as log:  # doctest: +SKIP
        ...     log.write(epoch, train_loss=0.41, lr=0.009, pixAcc=0.93, mIoU=0.71)
    """

    def __init__(self, log_dir: str, csv_name: Optional[str] = "log.csv", jsonl_name: Optional[str] = "log.jsonl",
                 tensorboard: bool = False, enabled: Optional[bool] = None, wandb: bool = False,
                 config: Optional[Mapping[str, Any]] = None) -> None:
        self.log_dir = os.fspath(log_dir)
        self.enabled = is_main_process() if enabled is None else bool(enabled)
        self.csv_path = os.path.join(self.log_dir, csv_name) if csv_name else None
        self.jsonl_path = os.path.join(self.log_dir, jsonl_name) if jsonl_name else None
        self.sinks: List[Any] = []
        if self.enabled:
            os.makedirs(self.log_dir, exist_ok=True)
            wanted = [(tensorboard, lambda: TensorBoardSink(self.log_dir)),
                      (wandb, lambda: WandbSink(self.log_dir, config, name=os.path.basename(self.log_dir)))]
            for requested, make in wanted:
                try:
                    self.sinks += [make()] if requested else []
                except MonitorUnavailable as err:
                    warnings.warn(f"{err}; EpochLogger writes CSV/JSONL without it", RuntimeWarning, stacklevel=2)

    def write(self, epoch: int, **values: Any) -> Dict[str, Any]:
        """Record ``epoch`` and ``values`` (numbers, tensors, short lists) and return the row as written to JSONL."""
        row = self._row(epoch, values)
        if self.enabled:
            self._record(row, [path for path in (self.jsonl_path, self.csv_path) if path])
        return row

    @staticmethod
    def _row(epoch: int, values: Mapping[str, Any]) -> Dict[str, Any]:
        return {"epoch": int(epoch), **{k: _jsonable(v) for k, v in values.items() if k != "epoch"}}

    def _record(self, row: Dict[str, Any], paths: Sequence[str]) -> None:
        """Append ``row`` to the logs among ``paths`` (the JSONL and / or the CSV file) and hand it to the sinks."""
        if self.jsonl_path in paths:
            self._append_jsonl(row)
        if self.csv_path in paths:
            self._append_csv(row)
        for sink in self.sinks:
            sink.scalars(row["epoch"], scalars_of(row))

    def images(self, epoch: int, images: Mapping[str, Any]) -> None:
        """Hand ``H x W x 3`` ``uint8`` images by tag (e.g. prediction overlays) to TensorBoard / W&B."""
        if self.enabled:
            for sink in self.sinks:
                sink.images(int(epoch), images)

    def rows(self) -> List[Dict[str, Any]]:
        """The rows of ``log.jsonl`` (empty when it is disabled or absent); a torn last line is ignored."""
        if not self.jsonl_path or not os.path.isfile(self.jsonl_path):
            return []
        rows = []
        with open(self.jsonl_path, encoding="utf-8") as f:
            for line in f:
                try:
                    rows.append(json.loads(line))
                except ValueError:
                    continue
        return rows

    def resume_after(self, epoch: int, row: Optional[Mapping[str, Any]] = None) -> None:
        """Make the log end at ``epoch`` when a run resumes from a checkpoint of that epoch: rows of later epochs
        (written after that checkpoint, e.g. when resuming an older ``model_best.pth``) and a row cut short by a
        kill are dropped, and ``row`` (the checkpoint's own row) is appended to each file that lacks it (the run
        stopped before logging it, or in the middle of writing it)."""
        if not self.enabled:
            return
        logged = {path: keep(path, epoch) for path, keep in ((self.jsonl_path, self._keep_jsonl),
                                                              (self.csv_path, self._keep_csv)) if path}
        missing = [path for path, epochs in logged.items() if epoch not in epochs]
        if row and missing:
            self._record(self._row(epoch, row), missing)

    @staticmethod
    def _keep_jsonl(path: str, epoch: int) -> Set[int]:
        """Keep the whole rows of epochs up to ``epoch``; return their epochs."""
        if not os.path.isfile(path):
            return set()
        with open(path, encoding="utf-8") as f:
            lines = [line for line in f if line.strip()]
        kept, epochs = [], set()
        for line in lines:
            try:
                found = json.loads(line).get("epoch", -1)
            except ValueError:  # a line cut short
                continue
            if found <= epoch:
                kept.append(line if line.endswith("\n") else line + "\n")
                epochs.add(found)
        if kept != lines:
            atomic_write(path, "".join(kept))
        return epochs

    @staticmethod
    def _keep_csv(path: str, epoch: int) -> Set[int]:
        """Keep the whole rows of epochs up to ``epoch`` (not a last row cut short: one without its line end, or
        without all its cells); return their epochs."""
        if not os.path.isfile(path):
            return set()
        with open(path, newline="", encoding="utf-8") as f:
            text = f.read()
        records = list(csv.reader(io.StringIO(text, newline="")))
        header, rows = (records[0], records[1:]) if records else ([], [])
        if rows and not text.endswith("\n"):
            rows = rows[:-1]
        column = header.index("epoch") if "epoch" in header else None
        kept = [r for r in rows if len(r) == len(header) and column is not None and r[column].isdigit()
                and int(r[column]) <= epoch]
        if kept != records[1:]:
            buffer = io.StringIO(newline="")
            csv.writer(buffer).writerows([header] + kept)
            atomic_write(path, buffer.getvalue())
        return {int(r[column]) for r in kept}

    def _append_jsonl(self, row: Dict[str, Any]) -> None:
        with open(self.jsonl_path, "a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")

    def _append_csv(self, row: Dict[str, Any]) -> None:
        header: List[str] = []
        rows: List[Dict[str, Any]] = []
        if os.path.exists(self.csv_path) and os.path.getsize(self.csv_path) > 0:
            with open(self.csv_path, newline="", encoding="utf-8") as f:
                reader = csv.DictReader(f)
                header = list(reader.fieldnames or [])
                if not set(row) <= set(header):
                    rows = list(reader)
        cells = {k: _csv_cell(v) for k, v in row.items()}
        if header and set(row) <= set(header):
            with open(self.csv_path, "a", newline="", encoding="utf-8") as f:
                csv.DictWriter(f, fieldnames=header).writerow(cells)
            return
        header = header + [k for k in row if k not in header]
        text = io.StringIO(newline="")
        writer = csv.DictWriter(text, fieldnames=header)
        writer.writeheader()
        writer.writerows(rows + [cells])
        atomic_write(self.csv_path, text.getvalue())  # a new column rewrites the file: all or nothing

    def close(self) -> None:
        """Close the TensorBoard writer and the W&B run (CSV/JSONL files are closed after every row)."""
        for sink in self.sinks:
            sink.close()
        self.sinks = []

    def __enter__(self) -> "EpochLogger":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
