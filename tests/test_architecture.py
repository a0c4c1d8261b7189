"""The house stays as docs/architecture.md draws it: no import cycle, the documented dependency order, small
files and a narrow public surface (no module ``__getattr__``: tests/test_compat_conventions.py).

The import graph is read from the source with ``ast`` (nothing is imported), counting imports inside functions.
An import of a package's own ancestor is no edge: a package is always imported before its modules.
"""
from __future__ import annotations

import ast
import os
import re
from typing import Dict, List, Set

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(ROOT, "encoding")
ARCHITECTURE = os.path.join(ROOT, "docs", "architecture.md")


def _modules() -> Dict[str, str]:
    """Dotted module name -> file path, for every module of ``encoding``."""
    modules = {}
    for folder, _, files in os.walk(PACKAGE):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                dotted = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
                modules[dotted[: -len(".__init__")] if dotted.endswith(".__init__") else dotted] = path
    return modules


MODULES = _modules()


def _targets(module: str, is_package: bool, node: ast.AST) -> List[str]:
    """The modules of ``encoding`` an import statement depends on (``from pkg import sub`` -> ``pkg.sub``)."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        base = module if is_package else module.rsplit(".", 1)[0]
        if node.level:
            parts = base.split(".")
            base = ".".join(parts[: len(parts) - (node.level - 1)])
            target = base + ("." + node.module if node.module else "")
        else:
            target = node.module or ""
        names = [f"{target}.{a.name}" if f"{target}.{a.name}" in MODULES else target for a in node.names]
    resolved = []
    for name in names:
        while name and name not in MODULES:  # `import encoding.utils.files.x` -> the deepest module that exists
            name = name.rsplit(".", 1)[0] if "." in name else ""
        if name:
            resolved.append(name)
    return resolved


def import_graph() -> Dict[str, Set[str]]:
    """Module -> the modules of ``encoding`` it imports (anywhere in the file), ancestors left out."""
    graph = {}
    for module, path in MODULES.items():
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
        deps = set()
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for target in _targets(module, path.endswith("__init__.py"), node):
                    if target != module and not module.startswith(target + "."):
                        deps.add(target)
        graph[module] = deps
    return graph


def strongly_connected(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """The cycles of ``graph``: its strongly connected components of more than one module (Tarjan)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    components: List[List[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return components


def documented_layers() -> Dict[str, int]:
    """``docs/architecture.md``'s "Dependency order" list: top-level package -> its layer (0 = lowest)."""
    with open(ARCHITECTURE, encoding="utf-8") as f:
        text = f.read()
    section = text.split("## Dependency order", 1)[1].split("\n## ", 1)[0]
    layers = {}
    for line in section.splitlines():
        item = re.match(r"\s*(\d+)\.\s+(.*)", line)
        if item:
            listed = re.sub(r"\(.*\)", "", item.group(2))  # a remark in parentheses places nothing
            for name in re.findall(r"`(encoding\.\w+)`", listed):
                layers[name] = int(item.group(1))
    return layers


def _top(module: str) -> str:
    """``encoding.utils.metrics`` -> ``encoding.utils``; the root package stays ``encoding``."""
    return ".".join(module.split(".")[:2])


def test_the_graph_reader_sees_imports_inside_functions_and_relative_ones():
    graph = import_graph()
    assert "encoding.parallel.scatter_gather" in graph["encoding.parallel"]
    assert "encoding.engine.loop" in graph["encoding.engine"]
    cycle = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert strongly_connected(cycle) == [["a", "b", "c"]]
    layers = documented_layers()
    assert layers["encoding.parallel"] < layers["encoding.utils"] < layers["encoding.nn"] < layers["encoding.legacy"]


def test_no_import_cycle_among_encodings_modules():
    assert strongly_connected(import_graph()) == []


def test_every_package_is_placed_in_the_documented_dependency_order():
    layers = documented_layers()
    packages = {_top(m) for m in MODULES} - {"encoding"}
    assert packages <= set(layers), f"not in docs/architecture.md's dependency order: {sorted(packages - set(layers))}"


def test_imports_follow_the_documented_dependency_order():
    layers = documented_layers()
    upward = []
    for module, deps in import_graph().items():
        if _top(module) == "encoding":
            continue  # the root package imports its subpackages
        for dep in deps:
            if _top(dep) != _top(module) and layers[_top(dep)] > layers[_top(module)]:
                upward.append(f"{module} -> {dep}")
    assert upward == [], "imports against docs/architecture.md's dependency order"


def _lines(path: str) -> int:
    with open(path, encoding="utf-8") as f:
        return f.read().count("\n")


def test_no_module_of_the_library_is_over_400_lines():
    long = {os.path.relpath(p, ROOT): _lines(p) for p in MODULES.values() if _lines(p) > 400}
    assert long == {}


def test_the_scripts_stay_thin():
    folder = os.path.join(ROOT, "experiments", "segmentation")
    sizes = {name: _lines(os.path.join(folder, name)) for name in os.listdir(folder) if name.endswith(".py")}
    assert sum(sizes.values()) <= 500, sizes
    assert sizes["train.py"] <= 120


@pytest.mark.parametrize("package, most", [("encoding.utils", 25), ("encoding.parallel", 20)])
def test_public_surface_lists_what_users_call(package, most):
    import importlib

    names = importlib.import_module(package).__all__
    assert len(names) <= most, names
    assert len(set(names)) == len(names)
