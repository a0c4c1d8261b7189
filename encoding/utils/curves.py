"""Training curves of a run: loss, mIoU and learning rate per epoch, from its ``log.csv``, as a PNG (matplotlib),
and the one figure writer of the package's charts.

``train.py`` writes ``curves.png`` next to ``log.csv`` at the end of training when matplotlib is installed
(``pip install -e .[monitor]``); ``python -m encoding.utils.plot RUN/log.csv [--out FILE]`` (:mod:`.plot`: the
command apart, so that the package, which imports this module, does not import it) draws it for any run.
"""
from __future__ import annotations

import csv
import io
import os
from typing import Any, Dict, List, Optional

from .files import atomic_write, refuse_own_input

__all__ = ["CURVES_NAME", "save_figure", "read_log", "plot_log", "write_curves"]

#: The PNG written next to ``log.csv``.
CURVES_NAME = "curves.png"
#: The panels: (title, the log columns drawn in it).
PANELS = (("loss", ("loss",)), ("validation", ("mIoU", "pixAcc")), ("learning rate", ("lr",)))


def read_log(path: str) -> Dict[str, List[Optional[float]]]:
    """The columns of a ``log.csv`` as numbers (``None`` for an empty cell), ``epoch`` included.

    Raises:
        ValueError: the file is missing, empty, not UTF-8, not readable as CSV (e.g. a cell over the ``csv``
            field size limit), has no ``epoch`` column, or holds a cell that is not a number in a column that is
            drawn (the message names the file).
    """
    if not os.path.isfile(path):
        raise ValueError(f"{path}: no such log file")
    try:
        with open(path, newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f)
            rows = list(reader)
            header = reader.fieldnames or []
    except UnicodeDecodeError as err:
        raise ValueError(f"{path}: not a training log: not UTF-8 text (byte {err.start})") from None
    except csv.Error as err:  # e.g. a cell over the csv module's field size limit
        raise ValueError(f"{path}: not a training log: {str(err).splitlines()[0] if str(err) else 'bad CSV'}") from None
    if "epoch" not in header or not rows:
        raise ValueError(f"{path}: not a training log (expected a CSV with an 'epoch' column and one row per epoch)")
    wanted = ["epoch"] + [name for _, names in PANELS for name in names if name in header]
    columns: Dict[str, List[Optional[float]]] = {name: [] for name in wanted}
    for line, row in enumerate(rows, start=2):
        for name in wanted:
            cell = (row.get(name) or "").strip()
            try:
                columns[name].append(float(cell) if cell else None)
            except ValueError:
                raise ValueError(f"{path}: line {line}, column {name!r}: not a number: {cell!r}") from None
    return columns


def plot_log(path: str, out: Optional[str] = None) -> str:
    """Draw the curves of the ``log.csv`` at ``path`` into ``out`` (default: ``curves.png`` next to it).

    Returns:
        The PNG's path.

    Raises:
        ValueError: see :func:`read_log`.
        ImportError: matplotlib is not installed.
    """
    columns = read_log(path)
    try:
        import matplotlib
    except ImportError:
        raise ImportError("drawing the curves needs matplotlib: pip install -e .[monitor]") from None

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt
    from matplotlib.ticker import MaxNLocator

    out = out or os.path.join(os.path.dirname(os.path.abspath(path)), CURVES_NAME)
    refuse_own_input(out, path, "the curves")
    fig, axes = plt.subplots(1, len(PANELS), figsize=(4 * len(PANELS), 3.2))
    for ax, (title, names) in zip(axes, PANELS):
        for name in (n for n in names if n in columns):
            points = [(e, v) for e, v in zip(columns["epoch"], columns[name]) if v is not None]
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=name)
        ax.set_title(title)
        ax.set_xlabel("epoch")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        if title == "validation" and ax.lines:
            ax.legend()
    fig.tight_layout()
    return save_figure(fig, out, fmt=os.path.splitext(out)[1].lstrip(".").lower() or "png")


def save_figure(fig: Any, path: str, dpi: int = 100, fmt: str = "png") -> str:
    """Write the matplotlib figure ``fig`` to ``path`` atomically (rendered in memory first) and close it; returns
    ``path``. The one figure writer of the package's charts."""
    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    try:
        fig.savefig(buffer, format=fmt, dpi=dpi)
    finally:
        plt.close(fig)
    return atomic_write(path, buffer.getvalue())


def write_curves(path: str) -> Optional[str]:
    """:func:`plot_log` when matplotlib is installed (the end of a training run); ``None`` otherwise."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return None
    return plot_log(path)
