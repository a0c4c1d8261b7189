"""docs/architecture.md lists every room and every run hook: each module of ``encoding`` is named in its folder map
(a package's ``__init__.py`` by its folder's line), and each :class:`~encoding.engine.hooks.Hook` of the package has
a row in "The run's hooks" naming exactly the events it handles; and the other way, every name in the map exists.
"""
import ast
import re
from pathlib import Path
from typing import Dict, Set

ROOT = Path(__file__).resolve().parent.parent
PAGE = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
EVENTS = ("before_train", "before_epoch", "before_step", "after_step", "after_epoch", "after_train")


def _folder_map() -> Set[str]:
    """Every path the page's folder map (its ```` ```text ```` block) names, relative to the checkout."""
    block = PAGE.split("```text\n", 1)[1].split("```", 1)[0]
    stack, named = [], set()  # stack: (indent, folder)
    for line in block.splitlines():
        match = re.match(r"^(?P<indent> *)(?P<names>\S.*?)(?:\s{2,}.*)?$", line)
        if not match or not re.match(r"^[\w./*]+(\s+[\w.]+\.py)*$", match["names"]):
            continue  # a continued description
        indent = len(match["indent"])
        while stack and stack[-1][0] >= indent:
            stack.pop()
        parent = Path(*[folder for _, folder in stack]) if stack else Path()
        named.update(str(parent / name.rstrip("/")) for name in match["names"].split())
        if match["names"].endswith("/"):
            stack.append((indent, match["names"].rstrip("/")))
    return named


def _hooks() -> Dict[str, Set[str]]:
    """Every class of ``encoding`` deriving from ``Hook`` -> the events it overrides."""
    hooks = {}
    for path in sorted((ROOT / "encoding").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef) and any(getattr(b, "id", getattr(b, "attr", None)) == "Hook"
                                                      for b in node.bases):
                hooks[node.name] = {f.name for f in node.body if isinstance(f, ast.FunctionDef) and f.name in EVENTS}
    return hooks


def test_every_module_of_the_package_is_on_the_folder_map():
    named = _folder_map()
    missing = []
    for path in sorted((ROOT / "encoding").rglob("*.py")):
        rel = path.relative_to(ROOT)
        if str(rel) not in named and not (rel.name == "__init__.py" and str(rel.parent) in named):
            missing.append(str(rel))
    assert not missing, f"docs/architecture.md's file list lacks: {missing}"


def test_every_name_on_the_folder_map_exists():
    missing = [name for name in sorted(_folder_map())
               if not (list(ROOT.glob(name)) if "*" in name else (ROOT / name).exists())]
    assert not missing, f"docs/architecture.md names files that do not exist: {missing}"


def test_every_run_hook_has_a_row_with_its_events():
    section = PAGE.split("## The run's hooks\n", 1)[1].split("\n## ", 1)[0]
    rows = {m["name"]: {e.strip() for e in m["events"].split(",")}
            for m in re.finditer(r"^\| `(?P<name>\w+)` \| (?P<events>[\w, ]+) \|", section, re.M)}
    hooks = _hooks()
    assert {"Checkpointer", "Evaluation", "StopOnSignal"} <= set(hooks)  # the scan finds the run's hooks
    assert {name: rows.get(name) for name in hooks} == hooks, "a hook without its row, or with other events"
    assert set(rows) == set(hooks), f"rows of no hook: {set(rows) - set(hooks)}"
