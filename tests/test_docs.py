"""The documentation cannot rot: every code block of README.md and docs/**/*.md is run or checked on the CPU, and the
Sphinx site builds with warnings as errors (broken cross-references included).

* ```` ```python ```` blocks run, page by page, in order, in one namespace per page (in a temporary working
  directory, with ``ENCODING_DATA`` pointing there: nothing downloads, nothing is written outside it). A block
  preceded by the MyST comment ``% docs-test: gpu`` runs only where CUDA is available.
* ```` ```bash ```` blocks: every command is checked. ``python <our script>`` and ``python -m encoding...``
  arguments are parsed by that script's own argparse parser (dataset, model and backbone names are looked up in
  the registries), ``torchrun`` lines by torchrun's parser and then the script's, ``python -m sphinx`` by Sphinx's,
  ``pip install`` against the extras and requirements of setup.py; any other command fails the test.
* ```` ```json ```` blocks parse (the memory tool's report example is compared with a real report's keys);
  ```` ```text ```` blocks are not code (the folder map of architecture.md is checked against the tree).
* The site is built once per session with ``python -m sphinx -W`` (nitpicky for ``encoding.*`` references); the
  API pages must document every name of each package's ``__all__`` and the model table every registered model.
"""
import argparse
import ast
import contextlib
import importlib
import importlib.util
import io
import json
import re
import shlex
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Callable, Dict, Iterator, List, NamedTuple, Optional

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md"] + sorted(p for p in DOCS.rglob("*.md") if "_build" not in p.parts)

FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>`{3,}|~{3,})(?P<info>.*)$")
MARKER = re.compile(r"^%\s*docs-test:\s*(?P<marker>\S+)")
MARKERS = {"gpu"}  # run only with CUDA
SHELL = {"bash", "sh", "shell", "console"}
LANGUAGES = {"python", "json", "text"} | SHELL


class Block(NamedTuple):
    """One fenced code block of a Markdown page."""

    page: Path
    line: int  # 1-based line of the block's first line of code
    lang: str
    text: str
    marker: Optional[str]

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def code_blocks(page: Path) -> List[Block]:
    """The fenced code blocks of ``page`` (MyST directives such as ```` ```{toctree} ```` are not code)."""
    lines = page.read_text(encoding="utf-8").splitlines()
    blocks, i = [], 0
    while i < len(lines):
        match = FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        fence, info = match["fence"], match["info"].strip()
        end = i + 1
        while end < len(lines) and not re.match(rf"^\s*{re.escape(fence[0])}{{{len(fence)},}}\s*$", lines[end]):
            end += 1
        previous = next((lines[k].strip() for k in range(i - 1, -1, -1) if lines[k].strip()), "")
        marker = MARKER.match(previous)
        if not info.startswith("{"):
            body = textwrap.dedent("\n".join(lines[i + 1:end]))
            blocks.append(Block(page, i + 2, info.split()[0] if info else "", body, marker and marker["marker"]))
        i = end + 1
    return blocks


ALL_BLOCKS = [block for page in PAGES for block in code_blocks(page)]


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


# ---------------------------------------------------------------------------------------------------- the blocks
def test_code_block_parser(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# t\n\n```python\nx = 1\n```\n\n```{toctree}\nindex\n```\n\n% docs-test: gpu\n"
                    "````bash\npython a.py \\\n  --b\n````\n\n    ```text\n    tree\n    ```\n")
    blocks = code_blocks(page)
    assert [(b.lang, b.line, b.text, b.marker) for b in blocks] == [
        ("python", 4, "x = 1", None), ("bash", 13, "python a.py \\\n  --b", "gpu"), ("text", 18, "tree", None)]
    assert list(shell_commands(blocks[1])) == [["python", "a.py", "--b"]]


def test_pages_are_found():
    names = {rel(p) for p in PAGES}
    assert {"README.md", "docs/index.md", "docs/parallel.md", "docs/api/parallel.md"} <= names
    assert len([b for b in ALL_BLOCKS if b.lang == "python"]) >= 20


@pytest.mark.parametrize("block", ALL_BLOCKS, ids=lambda b: b.where)
def test_every_block_has_a_checked_language(block):
    assert block.lang in LANGUAGES, (
        f"{block.where}: code block in {block.lang or 'no language'!r}; the docs test runs or checks "
        f"{sorted(LANGUAGES)} (tests/test_docs.py)")
    assert block.marker is None or block.marker in MARKERS, f"{block.where}: unknown marker {block.marker!r}"


PYTHON_PAGES = sorted({b.page for b in ALL_BLOCKS if b.lang == "python"})


@pytest.fixture(scope="session")
def docs_data_root(tmp_path_factory) -> Path:
    """One data root for every page's examples (the ``shapes`` dataset is generated once)."""
    return tmp_path_factory.mktemp("docs-data")


@pytest.mark.parametrize("page", PYTHON_PAGES, ids=rel)
def test_python_blocks_run(page, tmp_path, monkeypatch, docs_data_root):
    """The page's Python blocks run in order in one namespace, as a reader would paste them."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ENCODING_DATA", str(docs_data_root))
    torch.manual_seed(0)
    namespace: Dict[str, object] = {"__name__": "__docs__"}
    try:
        for block in (b for b in code_blocks(page) if b.lang == "python"):
            if block.marker == "gpu" and not torch.cuda.is_available():
                continue
            # pad so that tracebacks give the line numbers of the Markdown file
            code = compile("\n" * (block.line - 1) + block.text, str(block.page), "exec")
            exec(code, namespace)  # noqa: S102 - the documentation's own examples
    finally:
        import torch.distributed as dist

        leaked = dist.is_available() and dist.is_initialized()
        if leaked:
            dist.destroy_process_group()
    assert not leaked, f"{rel(page)}: an example leaves a torch.distributed process group initialised"


# ------------------------------------------------------------------------------------------------- command lines
def shell_commands(block: Block) -> Iterator[List[str]]:
    """Each command of a shell block as an argv (continuations joined, comments dropped, split at ``&&``)."""
    text = re.sub(r"\\\n", " ", block.text)
    for line in text.splitlines():
        tokens = shlex.split(line, comments=True)
        command: List[str] = []
        for token in tokens + ["&&"]:
            if token in ("&&", "||", ";", "|"):
                if command:
                    yield command
                command = []
            else:
                command.append(token)


COMMANDS = [(block, k, argv) for block in ALL_BLOCKS if block.lang in SHELL
            for k, argv in enumerate(shell_commands(block))]


def _parse(parser: argparse.ArgumentParser, args: List[str], what: str) -> argparse.Namespace:
    """``parser.parse_args(args)``; an argparse error fails the test with argparse's message."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            return parser.parse_args(args)
    except SystemExit:
        pytest.fail(f"{what}: the options {args} are refused by its parser:\n{err.getvalue().strip()}")


def _check_names(ns: argparse.Namespace, what: str) -> None:
    """Dataset, model and backbone names of a parsed command exist in their registries."""
    from encoding.datasets import datasets
    from encoding.models import ARCHITECTURES, backbone_list
    from encoding.models.external import is_model_spec, parse_model_spec
    from torchvision.models import list_models

    registries = {"dataset": set(datasets), "model": set(ARCHITECTURES),
                  "backbone": set(backbone_list())}
    for attr, names in registries.items():
        value = getattr(ns, attr, None)
        if attr == "model" and is_model_spec(value):  # torchvision:NAME, transformers:PATH, module:factory
            spec = parse_model_spec(value)
            assert spec.kind != "torchvision" or spec.target in list_models(), f"{what}: no torchvision {value!r}"
        elif isinstance(value, str):
            assert value in names, f"{what}: --{attr} {value!r} is not one of {sorted(names)}"


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _segmentation_parser(script: str) -> argparse.ArgumentParser:
    """The parser of ``experiments/segmentation/<script>.py``: the shared options.py, ``build_parser(script)``."""
    option = _load(ROOT / "experiments" / "segmentation" / "options.py", "_docs_segmentation_option")
    return option.build_parser(script)


def _memory_balance_parser() -> argparse.ArgumentParser:
    from encoding.memory.cli import build_parser

    return build_parser()


def script_parser(script: str) -> Callable[[List[str]], argparse.Namespace]:
    """How to parse the arguments of ``script`` (a path relative to the repository root), by its own parser."""
    path = ROOT / script
    assert path.is_file(), f"{script} does not exist"
    parts = Path(script).parts
    if parts[:2] == ("experiments", "segmentation") and len(parts) == 3:
        name = Path(script).stem
        assert name in ("train", "test", "demo"), f"{script}: not one of the segmentation scripts train/test/demo"
        return lambda args: _parse(_segmentation_parser(name), args, script)
    if script == "scripts/memory_balance.py":
        return lambda args: _parse(_memory_balance_parser(), args, script)
    prepare = re.fullmatch(r"scripts/prepare_(\w+)\.py", script)
    if prepare:
        name = prepare[1]
        assert f'script_main("{name}")' in path.read_text(), f"{script} does not prepare {name!r}"
        from encoding.datasets.prepare import build_parser

        return lambda args: _parse(build_parser(), [name, *args], script)
    pytest.fail(f"the docs test does not know the options of {script}: add its parser to script_parser()")


def _setup_requirements() -> Dict[str, List[str]]:
    """``install_requires`` (key ``""``) and ``extras_require`` of setup.py, read without running it."""
    tree = ast.parse((ROOT / "setup.py").read_text())
    call = next(n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "setup")
    keywords = {k.arg: k.value for k in call.keywords}
    out = {"": ast.literal_eval(keywords["install_requires"])}
    out.update(ast.literal_eval(keywords["extras_require"]))
    return out


def _requirement_name(text: str) -> str:
    return re.match(r"[A-Za-z0-9_.\-]+", text)[0].lower().replace("_", "-")


def check_pip(args: List[str], what: str) -> None:
    """``pip install -e .[extras]`` names existing extras; other packages are requirements of setup.py."""
    assert args and args[0] == "install", f"{what}: only 'pip install' is expected in the docs"
    requirements = _setup_requirements()
    declared = {_requirement_name(r) for reqs in requirements.values() for r in reqs}
    args = args[1:]
    while args:
        arg = args.pop(0)
        if arg in ("-e", "--editable"):
            spec = args.pop(0)
            match = re.fullmatch(r"\.(?:\[(?P<extras>[\w,\- ]+)\])?", spec)
            assert match, f"{what}: 'pip install -e {spec}': expected . or .[extra,...]"
            for extra in (match["extras"] or "").split(","):
                assert not extra.strip() or extra.strip() in requirements, (
                    f"{what}: setup.py has no extra {extra.strip()!r} (extras: {sorted(set(requirements) - {''})})")
        elif arg in ("-q", "-U", "--upgrade", "--quiet"):
            continue
        else:
            assert not arg.startswith("-"), f"{what}: unexpected pip option {arg}"
            assert _requirement_name(arg) in declared, f"{what}: {arg} is not a requirement or extra of setup.py"


def check_python(args: List[str], what: str) -> None:
    """``python <script> ...`` or ``python -m <module> ...``."""
    assert args, f"{what}: python without arguments"
    if args[0] == "-m":
        module, rest = args[1], args[2:]
        if module == "pytest":
            for arg in rest:
                if not arg.startswith("-"):
                    assert (ROOT / arg.split("::")[0]).exists(), f"{what}: pytest path {arg} does not exist"
        elif module == "sphinx":
            from sphinx.cmd.build import get_parser

            ns = _parse(get_parser(), rest, "python -m sphinx")
            assert (ROOT / ns.sourcedir / "conf.py").is_file(), f"{what}: {ns.sourcedir} has no conf.py"
        elif module == "pip":
            check_pip(rest, what)
        elif module.startswith("encoding."):
            build_parser = getattr(importlib.import_module(module), "build_parser", None)
            assert build_parser is not None, f"{what}: {module} has no build_parser() for the docs test to check"
            _check_names(_parse(build_parser(), rest, f"python -m {module}"), what)
        else:
            pytest.fail(f"{what}: the docs test does not know 'python -m {module}'")
    else:
        assert args[0].endswith(".py"), f"{what}: expected a script, got {args[0]!r}"
        _check_names(script_parser(args[0])(args[1:]), what)


def check_torchrun(args: List[str], what: str) -> None:
    """torchrun's own options by torchrun's parser, then the training script's by its parser."""
    from torch.distributed.run import get_args_parser

    ns = _parse(get_args_parser(), args, "torchrun")
    assert not ns.module and not ns.no_python, f"{what}: expected 'torchrun [options] <script> [args]'"
    check_python([ns.training_script, *ns.training_script_args], what)


def check_command(argv: List[str], what: str) -> None:
    while argv and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", argv[0]):  # VAR=value prefixes
        argv = argv[1:]
    program, args = argv[0], argv[1:]
    if program in ("python", "python3"):
        check_python(args, what)
    elif program in ("pip", "pip3"):
        check_pip(args, what)
    elif program == "torchrun":
        check_torchrun(args, what)
    else:
        pytest.fail(f"{what}: the docs test does not know the command {program!r} (tests/test_docs.py)")


@pytest.mark.parametrize("block,index,argv", COMMANDS, ids=[f"{b.where}#{k}" for b, k, _ in COMMANDS])
def test_shell_commands_parse(block, index, argv):
    check_command(argv, f"{block.where}: {shlex.join(argv)}")


def inline_commands() -> List[tuple]:
    """Inline code spans that are complete commands of our scripts (no placeholders such as NAME, [...], ...)."""
    out = []
    for page in PAGES:
        for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            for span in re.findall(r"(?<!`)`([^`]+)`(?!`)", line):
                if not re.match(r"(python (experiments|scripts)/|torchrun )", span):
                    continue
                argv = shlex.split(span)
                if any("[" in t or "..." in t or re.fullmatch(r"[A-Z_]{2,}", t) for t in argv):
                    continue
                out.append((f"{rel(page)}:{number}", argv))
    return out


INLINE = inline_commands()


@pytest.mark.parametrize("where,argv", INLINE, ids=[f"{w} {a[1]}" for w, a in INLINE])
def test_inline_commands_parse(where, argv):
    check_command(argv, f"{where}: {shlex.join(argv)}")


def test_training_option_table_names_real_options():
    """Every option in docs/training.md's option table is accepted by train.py's parser."""
    rows = re.findall(r"^\| (`--[^|]*)\|", (DOCS / "training.md").read_text(encoding="utf-8"), flags=re.M)
    documented = {option for row in rows for option in re.findall(r"`(--[\w-]+)`", row)}
    known = {name for action in _segmentation_parser("train")._actions for name in action.option_strings}
    assert len(documented) > 15
    assert documented <= known, f"docs/training.md documents options train.py does not have: {documented - known}"


def test_quickstart_loads_the_default_training_run():
    """docs/quickstart.md builds the model that ``train.py`` trains by default (so that its checkpoint loads) and
    names that run's directory."""
    option = _load(ROOT / "experiments" / "segmentation" / "options.py", "_docs_segmentation_option")
    args = option.parse_args([])
    text = (DOCS / "quickstart.md").read_text(encoding="utf-8")
    call = re.search(r"get_segmentation_model\((.*?)\)\n", text, flags=re.S)[1]
    assert f'"{args.model}"' in call and f'dataset="{args.dataset}"' in call and f'backbone="{args.backbone}"' in call
    assert args.head_channels is None or f"channels={args.head_channels}" in call
    assert args.output_stride is None or f"output_stride={args.output_stride}" in call  # same weights, other net
    assert f"runs/{args.dataset}/{args.model}/{args.checkname}/model_best.pth" in text


def test_command_checker_fails_on_a_renamed_option():
    """The checks above can fail: an option that does not exist, an unknown script, a missing extra."""
    with pytest.raises(pytest.fail.Exception, match="refused by its parser"):
        check_command(["python", "scripts/memory_balance.py", "--simulated", "4"], "test")
    with pytest.raises(pytest.fail.Exception, match="does not know the command"):
        check_command(["make", "-C", "docs", "html"], "test")
    with pytest.raises(AssertionError, match="no extra"):
        check_command(["pip", "install", "-e", ".[nope]"], "test")
    with pytest.raises(AssertionError, match="not one of"):
        check_command(["python", "scripts/memory_balance.py", "--model", "fcn8s"], "test")


# ---------------------------------------------------------------------------------------------- json and text
@pytest.mark.parametrize("block", [b for b in ALL_BLOCKS if b.lang == "json"], ids=lambda b: b.where)
def test_json_blocks_parse(block):
    json.loads(block.text)


def test_memory_report_example_has_the_tools_keys(tmp_path):
    """docs/memory.md's JSON example only uses keys that a real (tiny, simulated) report has."""
    from encoding.memory.cli import parse_args
    from encoding.memory.report import memory_report

    example = next(json.loads(b.text) for b in ALL_BLOCKS if b.lang == "json" and b.page.name == "memory.md")
    args = parse_args(["--model", "fcn", "--backbone", "resnet18", "--crop-size", "32", "--simulate", "2",
                       "--strategies", "gather", "--max-batch", "--memory-limit", "64MiB",
                       "--out-dir", str(tmp_path)])  # never the checkout's runs/
    report = memory_report(args, progress=False)
    strategy_keys = set(report["strategies"]["gather"])
    assert set(example) <= set(report)
    assert set(example["config"]) - {"..."} <= set(report["config"])
    for name, entry in example["strategies"].items():
        assert name == "..." or set(entry) <= strategy_keys, f"docs/memory.md: {name}: {set(entry) - strategy_keys}"


def _identifiers(cell: str) -> List[str]:
    """The names of a migration-table cell: ``SyncBatchNorm(num_features, ...)`` -> SyncBatchNorm,
    ``SynchronizedBatchNorm1d/2d/3d`` -> the three names; attribute paths, dunders and ``...`` are left out."""
    names = []
    for span in re.findall(r"`([^`]+)`", cell):
        match = re.match(r"^([A-Za-z_]\w*)((?:/\dd)*)(?:\(.*)?$", span)
        if not match or match[1].startswith("__"):
            continue
        name, variants = match[1], match[2]
        if variants:  # Name1d/2d/3d
            stem = name[:-2]
            names += [name] + [stem + v for v in variants.split("/") if v]
        else:
            names.append(name)
    return names


def test_migration_guide_names_exist():
    """Every name docs/migration.md says lives in an ``encoding`` module is importable from there, and every old
    name ``encoding.legacy`` declares is in the row of its module."""
    from encoding.legacy import ALIASES

    checked, missing, documented = 0, [], set()
    for line in (DOCS / "migration.md").read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.startswith("|") or len(cells) != 3 or not cells[1].startswith("`encoding"):
            continue
        where = re.split(r" \(|→", cells[1])[0]
        for path in re.findall(r"`(encoding[\w.]*)`", where):
            try:
                module = importlib.import_module(path)
            except ImportError:  # an object path (e.g. encoding.parallel.PerSample): it must exist
                module_path, _, attr = path.rpartition(".")
                assert hasattr(importlib.import_module(module_path), attr), f"migration.md: {path} does not exist"
                checked += 1
                continue
            for name in _identifiers(cells[0]):
                checked += 1
                documented.add(f"{path}.{name}")
                if not hasattr(module, name):
                    missing.append(f"{path}.{name}")
    assert checked > 60
    assert not missing, f"docs/migration.md names what does not exist: {missing}"
    declared = {f"{module}.{name}" for module, names in ALIASES.items() for name in names}
    undocumented = declared - documented - {"encoding.utils.PALETTE_NAMES"}  # not a PE name (utils.md)
    assert not undocumented, f"declared old names missing from docs/migration.md: {sorted(undocumented)}"


# ------------------------------------------------------------------------------------------------ Sphinx build
def _sphinx(srcdir: Path, outdir: Path, doctrees: Optional[Path] = None) -> subprocess.CompletedProcess:
    """``python -m sphinx -W -b html`` with the site's docs/conf.py (also for another source folder), into
    ``outdir / "html"``."""
    return subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html", "-c", str(DOCS),
         "-d", str(doctrees or outdir / "doctrees"), str(srcdir), str(outdir / "html")],
        cwd=ROOT, capture_output=True, text=True, timeout=600)


#: Where the README's docs command writes the site (``docs/_build/html``, its doctrees in ``html/.doctrees``).
SITE = DOCS / "_build"
#: The pages Sphinx makes without a source.
GENERATED_PAGES = {"genindex", "search", "py-modindex"}


def _page_without_source(site: Path, page: Path) -> bool:
    rel = page.relative_to(site).with_suffix("")
    if rel.parts[0] in ("_modules", "_static", "_sources") or str(rel) in GENERATED_PAGES:
        return False
    return not any((DOCS / rel).with_suffix(suffix).is_file() for suffix in (".md", ".rst"))


@pytest.fixture(scope="session")
def built_site() -> Path:
    """The site, built once per session exactly as the README's docs command builds it, with warnings as errors,
    where that command writes it: the command, run after the suite (.ci/run), then redoes only what changed. A
    site holding a page whose source is gone (Sphinx keeps it) is built afresh."""
    html = SITE / "html"
    if html.is_dir() and any(_page_without_source(html, page) for page in html.rglob("*.html")):
        shutil.rmtree(SITE)
    result = _sphinx(DOCS, SITE, doctrees=html / ".doctrees")
    assert result.returncode == 0, f"python -m sphinx -W failed:\n{result.stderr[-6000:]}"
    return html


def test_site_builds_with_warnings_as_errors(built_site):
    for page in PAGES[1:]:
        html = built_site / page.relative_to(DOCS).with_suffix(".html")
        assert html.is_file(), f"{rel(page)} was not built (is it in a toctree?)"


@pytest.mark.parametrize("package", ["parallel", "memory", "nn", "models", "datasets", "utils", "engine",
                                     "engine.builders", "inference", "names",
                                     "config", "app"])
def test_api_pages_document_all_public_names(built_site, package):
    module = importlib.import_module(f"encoding.{package}")
    html = (built_site / "api" / f"{package.rsplit('.', 1)[-1]}.html").read_text(encoding="utf-8")
    documented = set(re.findall(rf'<dt class="sig sig-object py" id="encoding\.{package}\.(\w+)"', html))
    expected = {name for name in module.__all__ if not isinstance(getattr(module, name), type(module))}
    assert expected <= documented, f"docs/api/{package}.md misses {sorted(expected - documented)}"


def test_model_table_lists_every_registered_model(built_site):
    from encoding.models import ARCHITECTURES

    html = (built_site / "models.html").read_text(encoding="utf-8")
    table = html[html.index("encoding-model-table"):]
    table = table[:table.index("</table>")]
    rows = re.findall(r"<tr[^>]*>(.*?)</tr>", table, flags=re.S)[1:]
    names = [re.search(r'<span class="pre">(\w+)</span>', row)[1] for row in rows]
    assert names == list(ARCHITECTURES)


def test_recipe_table_lists_every_dataset_and_config_file(built_site):
    """One row for the built-in run, one per recipe of the package (a recipe for each dataset), one per file of
    experiments/segmentation/configs/."""
    from encoding.config import RECIPE_DIR
    from encoding.datasets import datasets

    html = (built_site / "training.html").read_text(encoding="utf-8")
    table = html[html.index("encoding-recipe-table"):]
    table = table[:table.index("</table>")]
    rows = re.findall(r"<tr[^>]*>(.*?)</tr>", table, flags=re.S)[1:]
    files = sorted(p.name for p in (ROOT / "experiments" / "segmentation" / "configs").iterdir()
                   if p.suffix in (".yaml", ".yml", ".json"))
    recipes = sorted(p.stem for p in Path(RECIPE_DIR).iterdir() if p.suffix == ".yaml")
    runs = [re.sub(r"<[^>]+>", "", re.search(r"<td[^>]*>(.*?)</td>", row, flags=re.S)[1]).strip() for row in rows]
    assert runs == ["no options (built-in)"] + [f"--dataset {name}" for name in recipes] + [
        f"--config configs/{name}" for name in files]
    assert {re.findall(r'<span class="pre">(\w+)</span>', row)[0] for row in rows} == set(datasets)


def _extension():
    sys.path.insert(0, str(DOCS / "_ext"))
    try:
        return importlib.import_module("encoding_docs")
    finally:
        sys.path.remove(str(DOCS / "_ext"))


def test_model_table_counts_parameters_like_torchvision():
    """The generated table's counts are real: FCN and DeepLabV3 (ResNet-50, aux) equal torchvision's models."""
    import torchvision

    rows = {row["name"]: row for row in _extension().model_rows()}
    with torch.device("meta"):
        fcn = torchvision.models.segmentation.fcn_resnet50(weights=None, weights_backbone=None, aux_loss=True)
        deeplab = torchvision.models.segmentation.deeplabv3_resnet50(weights=None, weights_backbone=None,
                                                                     aux_loss=True)
    assert rows["fcn"]["params_aux"] == sum(p.numel() for p in fcn.parameters()) == 35_322_218
    assert rows["deeplab"]["params_aux"] == sum(p.numel() for p in deeplab.parameters()) == 42_004_074
    assert rows["fcn"]["params"] < rows["fcn"]["params_aux"]
    assert rows["encnet"]["se_loss"] and rows["upernet"]["output_stride"] == 32


def test_broken_cross_reference_fails_the_build(tmp_path):
    """A reference to an ``encoding`` name that does not exist stops the -W build (the site's own conf.py)."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "index.md").write_text(
        "# Test\n\n{py:class}`encoding.parallel.DataParallelModel` exists (plain text here, not documented), "
        "{py:func}`encoding.parallel.no_such_function` does not.\n")
    result = _sphinx(src, tmp_path / "out")
    assert result.returncode != 0
    assert "encoding.parallel.no_such_function" in result.stderr
    assert "DataParallelModel" not in result.stderr


def test_model_table_says_which_presets_have_published_weights(built_site):
    from encoding.models import pretrained_model_list

    rows = {row["name"]: row for row in _extension().model_rows()}
    assert rows["fcn"]["weights"] == [p for p in pretrained_model_list() if p.startswith("fcn_")]
    assert "fcn_resnet50_voc" in rows["fcn"]["weights"] and rows["encnet"]["weights"] == []
    html = (built_site / "models.html").read_text(encoding="utf-8")
    table = html[html.index("encoding-model-table"):]
    table = table[:table.index("</table>")]
    assert "published weights" in table and "deeplab_resnet101_coco" in table


# ------------------------------------------------------------------- unrendered reST markup (issue 23, item 11)

#: What a reader must never see as typed: a double backquote, a role (``:meth:`x```), a reST link (```x`_``).
UNRENDERED = re.compile(r"``|:[a-z]+(?::[a-z]+)?:`[^`]*`|`[^`\s][^`]*`_\b")


def _visible_text(html: str) -> str:
    """The text a reader sees on a built page, without scripts, styles and code blocks (``<pre>``)."""
    from html.parser import HTMLParser

    class Text(HTMLParser):
        skip, parts = 0, []

        def handle_starttag(self, tag, attrs):
            self.skip += tag in ("script", "style", "pre")

        def handle_endtag(self, tag):
            self.skip -= tag in ("script", "style", "pre")

        def handle_data(self, data):
            if not self.skip:
                self.parts.append(data)

    parser = Text()
    parser.parts = []
    parser.feed(html)
    return "".join(parser.parts)


def unrendered_markup(text: str) -> List[str]:
    """The unrendered role / literal markup in ``text``, each with some context."""
    return [text[max(0, m.start() - 40):m.end() + 40].replace("\n", " ") for m in UNRENDERED.finditer(text)]


def test_unrendered_markup_is_detected():
    html = ('<p>Device lists hold <code class="docutils literal"><span class="pre">torch.device``s</span></code> and '
            'override :meth:`scatter`.</p><pre>``code`` is fine here</pre>')
    found = unrendered_markup(_visible_text(html))
    assert len(found) == 2 and "torch.device``s" in found[0] and ":meth:`scatter`" in found[1]
    assert unrendered_markup(_visible_text("<p><code>torch.device</code> objects</p>")) == []


def test_built_pages_show_no_unrendered_markup(built_site):
    """-W does not catch ``x``s (an inline literal whose end is followed by a letter runs on to the next ``) or a
    role swallowed by such a literal: the reader sees the markup as typed. No built page may show any."""
    found = {}
    for page in sorted(built_site.rglob("*.html")):
        if {"_modules", "_static", "_sources"} & set(page.relative_to(built_site).parts):
            continue
        hits = unrendered_markup(_visible_text(page.read_text(encoding="utf-8")))
        if hits:
            found[str(page.relative_to(built_site))] = hits
    assert found == {}, f"unrendered markup on the built pages: {found}"


def test_docstrings_have_no_unrendered_markup():
    """Every docstring of encoding/ (documented or not) parsed as Sphinx would (napoleon, then docutils): no text
    outside code blocks shows a double backquote or a role as typed."""
    from docutils import nodes
    from docutils.core import publish_doctree
    from docutils.parsers.rst import roles
    from sphinx.ext.napoleon import Config, GoogleDocstring

    def role(name, rawtext, text, lineno, inliner, options=None, content=None):
        return [nodes.literal(rawtext, text)], []

    for name in ("class", "meth", "func", "mod", "data", "attr", "obj", "exc", "ref", "doc", "math", "py:class",
                 "py:func", "py:meth", "py:mod", "py:data", "py:attr", "py:obj", "py:exc"):
        roles.register_local_role(name, role)
    skipped = (nodes.literal_block, nodes.doctest_block, nodes.math, nodes.math_block, nodes.system_message)

    def texts(node) -> Iterator[str]:
        if isinstance(node, nodes.Text):
            yield str(node)
        elif not isinstance(node, skipped):
            for child in node.children:
                yield from texts(child)

    config = Config(napoleon_use_param=True)
    found = []
    for path in sorted((ROOT / "encoding").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            doc = ast.get_docstring(node)
            if doc:
                rst = str(GoogleDocstring(doc, config))
                tree = publish_doctree(rst, settings_overrides={"report_level": 5, "halt_level": 5})
                found += [f"{rel(path)}:{getattr(node, 'lineno', 1)}: {hit}"
                          for hit in unrendered_markup(" ".join(texts(tree)))]
    assert found == [], "\n".join(found)
