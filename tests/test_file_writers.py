"""Every file the project writes is written atomically and never over its own input: a static enumeration of
the writers, the atomic helpers, writers that refuse their input, and predictions kept out of the evaluated dataset
(issue 35).
"""
import errno
import os

import pytest


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


#: The calls that put bytes in a file.
_FILE_CALLS = {"os.replace", "os.rename", "torch.save", "onnx.save", "torch.export.save", "np.save", "json.dump",
               "shutil.copy", "shutil.copyfile", "shutil.copy2", "shutil.move"}


_METHODS = {"save", "savefig", "write_text", "write_bytes", "to_csv"}
#: Calls of those names that return bytes and write nothing (safetensors.torch.save: the bytes atomic_write writes).
_BYTES_CALLS = {"_safetensors().save"}


#: (file, function) -> why its raw write is safe. Everything else must go through encoding.utils.files.atomic_write
#: (or atomic_path / staged_dir) or write into an in-memory buffer first.
ALLOWED = {
    ("encoding/utils/files.py", "atomic_write"): "the atomic helper itself (temporary file, fsync, rename)",
    ("encoding/utils/files.py", "atomic_path"): "the atomic helper for writers that take a file name",
    ("encoding/utils/files.py", "_swap_in"): "the atomic helper for folders: staged_dir's rename of a finished "
                                             "folder (and of the old one back on failure)",
    ("encoding/export/core.py", "_write"): "torch.export.save into atomic_path's temporary file",
    ("encoding/export/core.py", "_save_onnx"): "onnx.save into atomic_path's temporary file",
    ("encoding/datasets/prepare/shapes_render.py", "_generate"): "files of a staged_dir folder (renamed when whole)",
    ("encoding/datasets/prepare/download.py", "download"): "a .part file renamed over the target when complete",
    ("encoding/datasets/prepare/download.py", "_fetch_local"): "a .part file renamed over the target when complete",
    ("encoding/datasets/prepare/download.py", "_fetch_http"): "a .part file renamed over the target when complete",
    ("encoding/datasets/prepare/download.py", "_merge_move"): "moves extracted files out of a staged_dir folder",
    ("encoding/utils/logger.py", "_append_jsonl"): "appends one JSONL row per epoch (one write; resume drops a "
                                                   "torn row and completes the log)",
    ("encoding/utils/logger.py", "_append_csv"): "appends one CSV row per epoch (a new column: atomic_write)",
    ("encoding/memory/cuda.py", "_ddp_worker"): "a rank's result in the measurement's own temporary folder",
}


def _writes(path):
    """``(function, call, target)`` of every call in ``path`` that writes a file."""
    import ast

    found = []

    def visit(node, function, encoded=False):
        for child in ast.iter_child_nodes(node):
            name = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else function
            inner = encoded
            if isinstance(child, ast.Call):
                call = ast.unparse(child.func)
                args = [ast.unparse(a) for a in child.args]
                inner = encoded or call.endswith("atomic_write")  # bytes made for atomic_write (safetensors.save)
                if encoded or call in _BYTES_CALLS:
                    pass
                elif call in ("open", "io.open", "os.fdopen"):
                    modes = child.args[1:2] + [k.value for k in child.keywords if k.arg == "mode"]
                    mode = modes[0].value if modes and isinstance(modes[0], ast.Constant) else "r" if not modes \
                        else "?"
                    if set(mode) & set("wax+?"):
                        found.append((name, call, args[0]))
                elif call in _FILE_CALLS or call.rsplit(".", 1)[-1] in _METHODS and "." in call:
                    target = args[1] if call in ("torch.save", "onnx.save", "torch.export.save", "json.dump") and \
                        len(args) > 1 else (args[0] if args else "")
                    found.append((name, call, target))
            visit(child, name, inner)

    with open(path, encoding="utf-8") as f:
        visit(ast.parse(f.read()), "<module>")
    return found


def test_every_file_writer_of_the_project_is_atomic():
    """A static enumeration of the project's writers: each one writes into a memory buffer (then atomic_write), into
    a staged folder, or is one of the documented ALLOWED exceptions; a new raw write fails here."""
    raw, seen = [], set()
    for folder in ("encoding", "experiments", "scripts"):
        for dirpath, _, names in os.walk(os.path.join(ROOT, folder)):
            for name in sorted(n for n in names if n.endswith(".py")):
                rel = os.path.relpath(os.path.join(dirpath, name), ROOT).replace(os.sep, "/")
                for function, call, target in _writes(os.path.join(dirpath, name)):
                    if (rel, function) in ALLOWED:
                        seen.add((rel, function))
                    elif "buffer" not in target and "staging" not in target:
                        raw.append(f"{rel}:{function}: {call}({target})")
    assert raw == [], "raw file writes (route them through encoding.utils.files.atomic_write):\n" + "\n".join(raw)
    assert seen == set(ALLOWED) - {k for k in ALLOWED if not os.path.exists(os.path.join(ROOT, k[0]))}


def test_atomic_helpers_leave_the_old_file_on_failure_and_refuse_their_input(tmp_path):
    from encoding.utils.files import atomic_path, atomic_write, refuse_own_input

    target = tmp_path / "model.onnx"
    atomic_write(str(target), b"good")
    with pytest.raises(OSError, match="model.onnx"):
        with atomic_path(str(target)) as tmp:
            open(tmp, "wb").write(b"half")
            raise OSError(errno.ENOSPC, "No space left on device")
    assert target.read_bytes() == b"good" and sorted(os.listdir(tmp_path)) == ["model.onnx"]
    link = tmp_path / "link.onnx"
    os.link(target, link)
    for out, inputs, says in ((str(target), [str(target)], "input file"), (str(link), [str(target)], "input file"),
                              (str(tmp_path / "x" / ".." / "model.onnx"), [str(target)], "input file"),
                              ([str(tmp_path / "a"), str(tmp_path / "a")], [], "same file"),
                              (str(tmp_path), [], "directory")):
        with pytest.raises(ValueError, match=says):
            refuse_own_input(out, inputs, "--output")
    pairs = [("--json", str(tmp_path / "r.out")), ("--chart", str(tmp_path / "r.out"))]
    with pytest.raises(ValueError, match=r"--chart .*r\.out: the same file as --json .*r\.out"):
        refuse_own_input(pairs, [])
    with pytest.raises(ValueError, match=r"^--json .*link\.onnx: that is the input file .*model\.onnx"):
        refuse_own_input([("--json", str(link))], [str(target)])


def test_writers_refuse_their_own_input(tmp_path, capsys):
    from encoding.inference.demo import demo_outputs
    from encoding.utils.plot import main as plot_main

    image = tmp_path / "x_mask.png"
    image.write_bytes(b"an input image")
    other = tmp_path / "x.png"
    other.write_bytes(b"another")
    with pytest.raises(ValueError, match="input file"):
        demo_outputs([str(other), str(image)], str(tmp_path), overwrite=True)
    log = tmp_path / "log.csv"
    log.write_text("epoch,loss\n0,1.0\n1,0.5\n")
    assert plot_main([str(log), "--out", str(log)]) == 1
    assert "input file" in capsys.readouterr().err and log.read_text().startswith("epoch,loss")


def test_predictions_are_never_written_into_the_evaluated_dataset(tmp_path):
    from conftest import tiny_shapes_pair
    from torch.utils.data import Subset

    from encoding.errors import UsageError
    from encoding.inference.evaluation import _check_prediction_dir

    _, val = tiny_shapes_pair(str(tmp_path / "data"), num_val=2)
    masks = os.path.join(val.dataset_dir, "SegmentationClass")
    for inside in (val.dataset_dir, masks):  # a usage error: test.py's one line and status 2 (not "a bug")
        with pytest.raises(UsageError, match="inside the dataset folder"):
            _check_prediction_dir(inside, Subset(val, [0]))
    _check_prediction_dir(str(tmp_path / "preds"), val)  # elsewhere: fine
