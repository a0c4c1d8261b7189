"""The one progress-bar policy (encoding.utils.progress): bars on a terminal, plain lines when piped (issue 23.12)."""
import ast
import io
import os
import subprocess
import sys

import pytest
import torch
from torch import nn

from encoding.engine import evaluate, train_one_epoch
from encoding.utils import SegmentationMetric
from encoding.utils.progress import progress_bar, progress_style

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class _Terminal(io.StringIO):
    def isatty(self):
        return True


@pytest.fixture(autouse=True)
def _no_forced_style(monkeypatch):
    monkeypatch.delenv("ENCODING_PROGRESS", raising=False)


def test_a_piped_bar_writes_a_line_per_ten_percent_and_no_carriage_return():
    out = io.StringIO()
    bar = progress_bar(range(1000), desc="work", file=out, leave=False)
    for i in bar:
        bar.set_postfix(loss=i)
    text = out.getvalue()
    assert "\r" not in text and "\x1b" not in text
    lines = text.splitlines()
    assert 10 <= len(lines) <= 12, lines  # 0 %, 10 %, ..., 100 %
    assert "100%" in lines[-1] and "1000/1000" in lines[-1]


def test_a_terminal_gets_a_real_bar_and_the_environment_can_force_a_style(monkeypatch):
    out = _Terminal()
    for _ in progress_bar(range(50), file=out, mininterval=0):
        pass
    assert "\r" in out.getvalue()
    monkeypatch.setenv("ENCODING_PROGRESS", "off")
    quiet = _Terminal()
    for _ in progress_bar(range(50), file=quiet):
        pass
    assert quiet.getvalue() == ""
    monkeypatch.setenv("ENCODING_PROGRESS", "lines")
    assert progress_style(_Terminal()) == "lines"
    monkeypatch.setenv("ENCODING_PROGRESS", "fancy")
    with pytest.raises(ValueError, match="ENCODING_PROGRESS='fancy'"):
        progress_style()


def test_training_and_evaluation_piped_write_no_carriage_returns(capsys):
    torch.manual_seed(0)
    model = nn.Conv2d(3, 2, 1)
    image = torch.randn(2, 3, 4, 4)
    loader = [(image, (image[:, 0] > 0).long())] * 40
    train_one_epoch(model, nn.CrossEntropyLoss(), torch.optim.SGD(model.parameters(), lr=0.1), loader)
    evaluate(model, loader, SegmentationMetric(2))
    err = capsys.readouterr().err
    assert "\r" not in err
    assert len(err.splitlines()) <= 2 * 12


def test_a_piped_script_log_has_no_carriage_returns(tmp_path):
    data = tmp_path / "file.bin"
    data.write_bytes(os.urandom(1 << 20))
    code = ("import sys; from encoding.utils.files import file_checksum; "
            f"file_checksum({str(data)!r}, progress=True)")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": ROOT}, timeout=120)
    assert run.returncode == 0, run.stderr
    assert b"\r" not in run.stderr and b"sha256" in run.stderr  # bytes: text mode would turn \r into \n


def _tqdm_users():
    for folder, _, names in os.walk(os.path.join(ROOT, "encoding")):
        for name in names:
            if name.endswith(".py") and name != "progress.py":
                path = os.path.join(folder, name)
                with open(path) as f:
                    yield path, ast.parse(f.read())


def test_every_bar_of_the_library_goes_through_the_one_helper():
    offenders = []
    for path, tree in _tqdm_users():
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                module = getattr(node, "module", None) or ""
                names = [a.name for a in node.names]
                if module.startswith("tqdm") or any(n.startswith("tqdm") for n in names):
                    offenders.append(os.path.relpath(path, ROOT))
    assert not offenders, f"tqdm imported directly (use encoding.utils.progress.progress_bar): {offenders}"
