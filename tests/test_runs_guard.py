"""The guard that keeps the suite off the user's ``runs/`` sees every kind of access, in this process and in a
subprocess; and the whole suite really fails when a test touches the checkout's ``runs/``."""
import os
import subprocess
import sys
import textwrap

import pytest
from runs_guard import RunsGuard

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture
def user_runs(tmp_path):
    """A folder holding a finished run, as ``train.py`` leaves one."""
    run = tmp_path / "runs" / "shapes" / "unet" / "default"
    run.mkdir(parents=True)
    (run / "checkpoint.pth").write_bytes(b"weights")
    (run / "log.csv").write_text("epoch,loss\n0,1.0\n")
    return tmp_path / "runs"


def test_untouched_folder_has_no_problems(user_runs, tmp_path):
    guard = RunsGuard(user_runs).start()
    try:
        (tmp_path / "elsewhere.txt").write_text("x")  # beside runs/, not in it
        os.listdir(tmp_path)
        assert guard.problems() == []
    finally:
        guard.stop()


@pytest.mark.parametrize("action", ["read", "list", "create", "change", "delete"])
def test_every_access_in_this_process_is_seen(user_runs, action):
    run = user_runs / "shapes" / "unet" / "default"
    guard = RunsGuard(user_runs).start()
    try:
        if action == "read":
            (run / "log.csv").read_text()
        elif action == "list":
            os.listdir(run)
        elif action == "create":
            (run / "model_best.pth").write_bytes(b"new")
        elif action == "change":
            with open(run / "log.csv", "a") as f:
                f.write("1,0.5\n")
        else:
            os.remove(run / "checkpoint.pth")
        problems = guard.problems()
    finally:
        guard.stop()
    assert problems, action
    assert all(str(user_runs) in p or p.startswith(("created", "changed", "deleted")) for p in problems), problems


@pytest.mark.parametrize("script, expected", [
    ("open(sys.argv[1] + '/new.txt', 'w').write('x')", "created"),
    ("open(sys.argv[1] + '/shapes/unet/default/log.csv', 'a').write('more')", "changed"),
    ("os.remove(sys.argv[1] + '/shapes/unet/default/checkpoint.pth')", "deleted"),
])
def test_what_a_subprocess_does_is_seen(user_runs, script, expected):
    guard = RunsGuard(user_runs).start()
    try:
        subprocess.run([sys.executable, "-c", f"import os, sys; {script}", str(user_runs)], check=True)
        problems = guard.problems()
    finally:
        guard.stop()
    assert any(p.startswith(expected) for p in problems), problems


def test_a_suite_that_touches_runs_fails(tmp_path):
    """The session hook of conftest.py turns a touch of ``runs/`` into a failed run, although every test passed (a
    suite that touches nothing passes under the same hook: the suite itself shows it)."""
    (tmp_path / "runs").mkdir()
    (tmp_path / "conftest.py").write_text(textwrap.dedent(f"""
        import importlib.util, sys
        sys.path.insert(0, {HERE!r})
        spec = importlib.util.spec_from_file_location("suite_conftest", {os.path.join(HERE, "conftest.py")!r})
        real = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(real)
        real.USER_RUNS = {str(tmp_path / "runs")!r}
        pytest_sessionstart, pytest_sessionfinish = real.pytest_sessionstart, real.pytest_sessionfinish
        pytest_terminal_summary = real.pytest_terminal_summary
    """))
    (tmp_path / "test_touch.py").write_text("import os\n\ndef test_lists_runs():\n    os.listdir('runs')\n")
    touched = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_touch.py"],
                             cwd=tmp_path, capture_output=True, text=True)
    assert touched.returncode == 1, touched.stdout + touched.stderr
    assert "1 passed" in touched.stdout  # the test passed: the session hook failed the run
    assert "touched the checkout's runs/" in touched.stdout and "os.listdir" in touched.stdout
