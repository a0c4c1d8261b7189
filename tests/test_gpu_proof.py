"""benchmarks/gpu_proof.py (issue 36, item 4): the one-command GPU proof runs on a CPU-only machine too, skipping
what needs CUDA and saying so, and writes its Markdown report."""
import os
import subprocess
import sys

import pytest
import torch

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def test_gpu_proof_quick_on_the_cpu_writes_every_section(tmp_path):
    out = tmp_path / "proof.md"
    done = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "gpu_proof.py"), "--quick", "--cpu",
                           "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    text = out.read_text()
    for title in ("pytest -m gpu", "Simulator against torch.cuda.max_memory_allocated",
                  "DataParallelModel + DataParallelCriterion", "Train images/s against torchvision's FCN",
                  "CUDA context and the caching allocator",
                  "Compiled training against eager and segmentation_models_pytorch",
                  "Batched sliding windows against one window per forward"):
        assert f"## {title}" in text, title
    assert "FAILED" not in text
    assert text.count("skipped: CUDA is not available") >= 3  # tests, measured memory, allocator: said, not hidden
    rows = [line.split("|") for line in text.splitlines() if line.startswith("| FCN-")]
    assert len(rows) == 4 and all(float(row[4]) > 0 for row in rows)  # the simulated MiB of every model x dtype
    ratio = next(line for line in text.splitlines() if line.startswith("| ours |") and "smp" not in line).split("|")[3]
    assert float(ratio) > 0
    peers = next(line for line in text.splitlines() if line.startswith("| fcfpn | FPN |")).split("|")
    assert float(peers[3]) > 0 and float(peers[4]) > 0  # ours and smp's images/s at equal architecture
    assert "Compiled: skipped in --quick mode on the CPU" in text  # said, not hidden
    slide = next(line for line in text.splitlines() if "(the default budget)" in line).split("|")
    assert float(slide[3]) > 0 and slide[4].strip() == "True"  # batched windows: the same labels
    assert not list(tmp_path.glob(".*tmp*"))  # written atomically: no temporary file left


@pytest.mark.gpu
def test_gpu_proof_quick_on_the_gpu_measures(tmp_path):
    out = tmp_path / "proof.md"
    subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "gpu_proof.py"), "--quick", "--skip", "tests",
                    "compile", "--out", str(out)], check=True, timeout=600)
    text = out.read_text()
    assert torch.cuda.get_device_name(0) in text and "suggested --reserve" in text and "FAILED" not in text
