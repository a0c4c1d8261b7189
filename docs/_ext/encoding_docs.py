"""Local Sphinx extension of the ``encoding`` documentation: generated content that cannot drift from the code.

Directives:

* ``{encoding-model-table}``: every registered segmentation model (:data:`encoding.models.ARCHITECTURES`) with its
  classes, head, stages, default output stride, parameter counts and presets with published weights, computed at
  build time (the models are built
  on the ``meta`` device: no memory, no weights, nothing downloaded).
* ``{encoding-pe-zoo-table}``: the presets of PyTorch-Encoding's ResNeSt model zoo with their parameters, GFLOPs
  and PE's published pixAcc / mIoU (:data:`encoding.models.registry.PE_PUBLISHED`).
* ``{encoding-recipe-table}``: the built-in run (``train.py`` without options), every dataset's recipe shipped with
  the package (``encoding.config.RECIPE_DIR``, as ``train.py --dataset NAME`` runs it) and every configuration file of
  ``experiments/segmentation/configs/`` (the other experiments, as ``train.py --config FILE`` runs them): parsed by
  the script's own option parser (``experiments/segmentation/options.py``).
* ``.. encoding-api:: encoding.nn`` (reST): the API reference of a package's public ``__all__`` (``automodule``,
  plus ``autodata`` for re-exported data, which ``automodule`` skips).

GFLOPs (at :data:`FLOPS_SIZE` squared, one image, eval mode) are counted with torch's ``FlopCounterMode`` on fake
tensors (:func:`encoding.models.flops.count_flops`) and cached with the parameter counts in ``flops_cache.json``
next to this file, keyed by the build arguments and the package version (delete the file to recount).

Hooks: every name of ``__all__`` is documented (with or without a docstring; lazily resolved names included), private
base classes are left out of "Bases:", and references to an ``encoding`` object through the module that defines it
(``encoding.models.base.FeatureInfo``, as type hints and docstrings write it) resolve to its documented public name
(``encoding.models.FeatureInfo``). A reference to an ``encoding`` object that exists but is not part of the API
reference (a private helper) is rendered as plain text; a reference to a name that does not exist stays
unresolved, which the nitpicky ``-W`` build turns into an error.
"""
from __future__ import annotations

import importlib
import re
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional

from docutils import nodes
from docutils.statemachine import StringList
from sphinx.application import Sphinx
from sphinx.util.docutils import SphinxDirective

#: Number of classes of the models whose parameters the table counts (PASCAL VOC's 21, as torchvision's models).
TABLE_NCLASS = 21
#: Backbone of the parameter counts.
TABLE_BACKBONE = "resnet50"
_MISSING = object()
#: Side of the square input of the GFLOPs columns.
FLOPS_SIZE = 512
_FLOPS_CACHE = Path(__file__).with_name("flops_cache.json")


def measure(**build: Any) -> Dict[str, int]:
    """``{"params", "flops"}`` of ``get_segmentation_model(**build)`` (FLOPs of one :data:`FLOPS_SIZE` image), from
    the cache file or counted on fake tensors (and cached)."""
    import json

    import encoding
    from encoding.models import get_segmentation_model
    from encoding.models.flops import count_flops, fake_mode

    key = json.dumps([sorted(build.items()), FLOPS_SIZE, encoding.__version__])
    cache = json.loads(_FLOPS_CACHE.read_text()) if _FLOPS_CACHE.is_file() else {}
    if key not in cache:
        with fake_mode():
            model = get_segmentation_model(**build)
        cache[key] = {"params": sum(p.numel() for p in model.parameters()),
                      "flops": count_flops(model, (FLOPS_SIZE, FLOPS_SIZE))}
        try:
            _FLOPS_CACHE.write_text(json.dumps(cache, indent=1, sort_keys=True) + "\n")
        except OSError:  # a read-only checkout: count again next time
            pass
    return cache[key]


def _count(name: str, *, aux: bool, se_loss: bool) -> int:
    """Parameters of the registered model ``name`` (ResNet-50, :data:`TABLE_NCLASS` classes), built on ``meta``."""
    import torch
    from encoding.models import get_segmentation_model

    with torch.device("meta"):
        model = get_segmentation_model(name, backbone=TABLE_BACKBONE, nclass=TABLE_NCLASS, aux=aux, se_loss=se_loss)
    return sum(p.numel() for p in model.parameters())


def model_rows() -> List[Dict[str, Any]]:
    """One row per registered architecture, in registration order.

    Returns:
        dicts with ``name``, ``model`` (class name), ``head`` (head class name; ``head_class`` the class), ``stages`` (the backbone stages
        the head consumes, e.g. ``"c4"``), ``output_stride`` (default), ``se_loss`` (has an SE-loss branch),
        ``params`` (with :data:`TABLE_BACKBONE`, no auxiliary head), ``params_aux`` (with the auxiliary head,
        and the SE branch where there is one) and ``weights`` (its presets with published weights, from
        :func:`encoding.models.pretrained_model_list`).
    """
    import torch
    from encoding.models import pretrained_model_list
    from encoding.models.registry import PRESETS

    weights = {}
    for preset in pretrained_model_list():
        weights.setdefault(PRESETS[preset]["name"], []).append(preset)
    from encoding.models import ARCHITECTURES, get_segmentation_model

    rows = []
    for name, arch in ARCHITECTURES.items():
        with torch.device("meta"):
            model = get_segmentation_model(name, backbone=TABLE_BACKBONE, nclass=TABLE_NCLASS)
        rows.append(dict(
            name=name,
            model=arch.model.__name__,
            head=type(model.classifier).__name__,
            head_class=type(model.classifier),
            stages=", ".join(f"c{i + 1}" for i in arch.model.head_inputs),
            output_stride=arch.output_stride,
            se_loss=arch.se_loss,
            params=sum(p.numel() for p in model.parameters()),
            params_aux=_count(name, aux=True, se_loss=arch.se_loss),
            gflops=measure(name=name, backbone=TABLE_BACKBONE, nclass=TABLE_NCLASS)["flops"] / 1e9,
            weights=weights.get(name, []),
        ))
    return rows


def _public_name(cls_name: str) -> str:
    """A MyST reference to ``encoding.models.<cls_name>`` when that public name exists, else the literal name."""
    import encoding.models

    return f"{{py:class}}`~encoding.models.{cls_name}`" if hasattr(encoding.models, cls_name) else f"`{cls_name}`"


def _summary(cls: type) -> str:
    """The first sentence of ``cls``'s docstring, with its reST markup turned into MyST (for a table cell)."""
    doc = (cls.__doc__ or "").strip().split("\n\n")[0]
    text = " ".join(line.strip() for line in doc.splitlines())
    text = re.split(r"(?<=\.)\s", text, maxsplit=1)[0]
    text = re.sub(r":class:`~?([\w.]+)`", lambda m: _public_name(m[1].rsplit(".", 1)[-1]), text)
    return re.sub(r"``([^`]+)``", r"`\1`", text).replace("|", "\\|")


def model_table_markdown() -> str:
    """The model table as Markdown (a GitHub-style table with MyST cross-reference roles)."""
    lines = [
        "| name | model | head | stages | output stride | SE loss | params (M) | with aux (M) "
        f"| GFLOPs ({FLOPS_SIZE}²) | published weights |",
        "|---|---|---|---|---:|---|---:|---:|---:|---|",
    ]
    for row in model_rows():
        head = f"{_public_name(row['head'])}: {_summary(row['head_class'])}"
        lines.append(
            f"| `{row['name']}` | {_public_name(row['model'])} | {head} | {row['stages']} "
            f"| {row['output_stride']} | {'yes' if row['se_loss'] else 'no'} | {row['params'] / 1e6:.2f} "
            f"| {row['params_aux'] / 1e6:.2f} | {row['gflops']:.1f} "
            f"| {', '.join(f'`{p}`' for p in row['weights']) or 'none'} |")
    return "\n".join(lines) + "\n"


class _MarkdownTable(SphinxDirective):
    """A directive without arguments or content that renders the Markdown table of :meth:`markdown`, in a container
    classed by its directive name (``self.name``, given by docutils)."""

    has_content = False

    def markdown(self) -> str:
        raise NotImplementedError

    def run(self) -> List[nodes.Node]:
        container = nodes.container(classes=[self.name])
        self.state.nested_parse(StringList(self.markdown().splitlines(), source=f"<{self.name}>"),
                                self.content_offset, container)
        return [container]


class ModelTable(_MarkdownTable):
    """``{encoding-model-table}``: the generated model table."""

    def markdown(self) -> str:
        return model_table_markdown()


def pe_zoo_rows() -> List[Dict[str, Any]]:
    """One row per preset of PyTorch-Encoding's ResNeSt zoo (:data:`encoding.models.registry.PE_PUBLISHED`): ``name``,
    ``params`` and ``gflops`` of the preset as built (auxiliary head included), PE's ``pixacc`` and ``miou``."""
    from encoding.models.registry import PE_PUBLISHED, PRESETS

    rows = []
    for name, (pixacc, miou) in PE_PUBLISHED.items():
        counts = measure(**PRESETS[name])
        rows.append(dict(name=name, params=counts["params"], gflops=counts["flops"] / 1e9, pixacc=pixacc,
                         miou=miou))
    return rows


def pe_zoo_table_markdown() -> str:
    """The ResNeSt preset table as Markdown."""
    lines = [f"| preset | params (M) | GFLOPs ({FLOPS_SIZE}²) | PE's pixAcc (%) | PE's mIoU (%) |",
             "|---|---:|---:|---:|---:|"]
    for row in pe_zoo_rows():
        lines.append(f"| `{row['name']}` | {row['params'] / 1e6:.1f} | {row['gflops']:.0f} | {row['pixacc']:.2f} "
                     f"| {row['miou']:.2f} |")
    return "\n".join(lines) + "\n"


class PEZooTable(_MarkdownTable):
    """``{encoding-pe-zoo-table}``: PyTorch-Encoding's ResNeSt presets with PE's published results."""

    def markdown(self) -> str:
        return pe_zoo_table_markdown()


def _segmentation_options() -> Any:
    """``experiments/segmentation/options.py``, the option parser of the segmentation scripts (loaded by path)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "experiments" / "segmentation" / "options.py"
    spec = importlib.util.spec_from_file_location("_encoding_docs_option", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def recipe_rows() -> List[Dict[str, Any]]:
    """What ``train.py`` runs without options (``config`` ``None``), with ``--dataset NAME`` for every recipe of
    the package and with ``--config FILE`` for every file of ``experiments/segmentation/configs/`` (sorted): the
    options ``option.parse_args`` fills in, plus the dataset's class count and sizes."""
    import os

    from encoding.config import RECIPE_DIR
    from encoding.datasets import datasets

    option = _segmentation_options()
    recipes = sorted(name[:-5] for name in os.listdir(RECIPE_DIR) if name.endswith(".yaml"))
    files = sorted(name for name in os.listdir(option.CONFIGS) if name.endswith((".yaml", ".yml", ".json")))
    runs = [(None, [])] + [(f"--dataset {name}", ["--dataset", name]) for name in recipes] + [
        (f"--config configs/{name}", ["--config", os.path.join(option.CONFIGS, name)]) for name in files]
    rows = []
    for label, argv in runs:
        args = option.parse_args(argv)
        dataset = datasets[args.dataset]
        rows.append(dict(config=label, dataset=args.dataset, nclass=dataset.NUM_CLASS,
                         base_size=args.base_size or dataset.BASE_SIZE, crop_size=args.crop_size or dataset.CROP_SIZE,
                         scale_range=args.scale_range or dataset.SCALE_RANGE, model=args.model,
                         backbone=args.backbone, output_stride=args.output_stride, head_channels=args.head_channels,
                         epochs=args.epochs, batch_size=args.batch_size, lr=args.lr, optimizer=args.optimizer,
                         weight_decay=args.weight_decay))
    return rows


def recipe_table_markdown() -> str:
    """The built-in run and the configuration files of ``train.py`` as a Markdown table."""
    lines = ["| `train.py` | `--dataset` | classes | base / crop | scale range | model | backbone | output stride "
             "| head channels | epochs | batch | lr | optimizer |",
             "|---|---|---:|---|---|---|---|---|---|---:|---:|---:|---|"]
    for row in recipe_rows():
        stride = row["output_stride"] if row["output_stride"] is not None else "the model's"
        width = row["head_channels"] if row["head_channels"] is not None else "the model's"
        low, high = row["scale_range"]
        scales = f"{low:g} (none)" if low == high else f"{low:g}–{high:g}"
        config = f"`{row['config']}`" if row["config"] else "no options (built-in)"
        lines.append(f"| {config} | `{row['dataset']}` | {row['nclass']} | {row['base_size']} / {row['crop_size']} "
                     f"| {scales} | `{row['model']}` | `{row['backbone']}` | {stride} | {width} | {row['epochs']} "
                     f"| {row['batch_size']} | {row['lr']:g} | `{row['optimizer']}`, weight decay "
                     f"{row['weight_decay']:g} |")
    return "\n".join(lines) + "\n"


class RecipeTable(_MarkdownTable):
    """``{encoding-recipe-table}``: the built-in run and the configuration files of ``train.py``, from its own
    option parser."""

    def markdown(self) -> str:
        return recipe_table_markdown()


def _import(path: str) -> Optional[Any]:
    """The object named by the dotted ``path`` (longest importable module prefix, then attributes), or ``None``."""
    parts = path.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        try:
            for attr in parts[i:]:
                obj = getattr(obj, attr)
        except AttributeError:
            return None
        return obj
    return None


def _documented_by_identity(app: Sphinx, env: Any) -> Dict[int, str]:
    """``id(object) -> documented full name`` for every ``encoding`` object of the Python domain (cached per build,
    on the application: the environment is pickled between builds, object ids are not stable)."""
    cache = getattr(app, "_encoding_documented", None)
    if cache is not None:
        return cache
    cache = {}
    for fullname, entry in env.get_domain("py").objects.items():
        if not fullname.startswith("encoding.") or entry.aliased:
            continue
        obj = _import(fullname)
        if obj is not None and not isinstance(obj, (int, float, str, bool, type(None))):
            cache.setdefault(id(obj), fullname)
    app._encoding_documented = cache
    return cache


def resolve_by_identity(app: Sphinx, env: Any, node: nodes.Element, contnode: nodes.Element) -> Optional[nodes.Node]:
    """``missing-reference`` handler: resolve ``encoding.<private module>.Name`` to the documented public name."""
    if node.get("refdomain") != "py":
        return None
    target = node.get("reftarget", "")
    candidates = [target]
    module = node.get("py:module")
    if module and not target.startswith("encoding."):
        candidates.insert(0, f"{module}.{target}")
    for candidate in candidates:
        if not candidate.startswith("encoding."):
            continue
        obj = _import(candidate)
        if obj is None:
            continue
        documented = _documented_by_identity(app, env).get(id(obj))
        if documented is None:
            # it exists (so the reference is not broken) but the API reference does not document it: plain text
            return contnode
        if documented == candidate:
            continue
        domain = env.get_domain("py")
        node = node.deepcopy()
        node["reftarget"] = documented
        node["refspecific"] = False
        return domain.resolve_xref(env, node["refdoc"], app.builder, node["reftype"], documented, node, contnode)
    return None


class ApiReference(SphinxDirective):
    """``.. encoding-api:: encoding.nn`` (reST, e.g. in an ``{eval-rst}`` block): the package's public ``__all__``.

    ``automodule`` documents the classes and functions of ``__all__``; the data of ``__all__`` (``ARCHITECTURES``,
    ``IGNORE_INDEX``, ...) is re-exported from submodules, which ``automodule`` skips, so each gets an ``autodata``
    (with the ``#:`` doc comment of the module that defines it). Submodules listed in ``__all__`` are not repeated.
    """

    required_arguments = 1
    has_content = False

    def run(self) -> List[nodes.Node]:
        import inspect
        import types

        from sphinx.pycode import ModuleAnalyzer

        modname = self.arguments[0]
        module = importlib.import_module(modname)
        own_docs = ModuleAnalyzer.for_module(modname).find_attr_docs()  # data automodule documents itself
        lines = [f".. automodule:: {modname}", ""]
        for name in getattr(module, "__all__", ()):
            obj = getattr(module, name)
            if ("", name) in own_docs:
                continue
            if not (inspect.isclass(obj) or inspect.isroutine(obj) or isinstance(obj, types.ModuleType)):
                lines += [f".. autodata:: {modname}.{name}", ""]
        container = nodes.container(classes=["encoding-api"])
        self.state.nested_parse(StringList(lines, source=f"<encoding-api {modname}>"), self.content_offset,
                                container)
        return container.children


def reset_documented_names(app: Sphinx) -> None:
    """Forget the public-name cache of :func:`_documented_by_identity` at the start of each build."""
    app._encoding_documented = None


def keep_public_members(app: Sphinx, what: str, name: str, obj: Any, skip: bool, options: Any) -> Optional[bool]:
    """``autodoc-skip-member``: every name of a package's ``__all__`` is documented, with a docstring or not.

    autodoc only offers a module the members listed in its ``__all__``, so keeping them all is safe; class members
    keep autodoc's default decision.
    """
    if what == "module":
        return False
    return None


def _defining_doc_comment(obj: Any, name: str) -> List[str]:
    """The ``#:`` doc comment of ``name`` in the ``encoding`` module that binds it to ``obj`` (imported data has none
    in the package that re-exports it)."""
    from sphinx.pycode import ModuleAnalyzer

    for modname, module in sorted(sys.modules.items()):
        if not modname.startswith("encoding") or module is None or vars(module).get(name, _MISSING) is not obj:
            continue
        try:
            docs = ModuleAnalyzer.for_module(modname).find_attr_docs()
        except Exception:  # noqa: BLE001 - no source (compiled / frozen): try the next module
            continue
        if ("", name) in docs:
            return list(docs[("", name)])
    return []



def document_reexported_data(app: Sphinx, what: str, name: str, obj: Any, options: Any, lines: List[str]) -> None:
    """``autodoc-process-docstring``: data re-exported by a package gets the doc comment of its defining module
    (instead of nothing, or of the docstring of its value's type)."""
    if what != "data" or not name.startswith("encoding."):
        return
    doc = _defining_doc_comment(obj, name.rsplit(".", 1)[-1])
    if doc:
        lines[:] = doc
    elif lines and type(obj).__doc__ and lines[0].strip() == type(obj).__doc__.strip().splitlines()[0].strip():
        lines[:] = []  # the docstring of the value's type (dict, tuple, ...), not of this name


def _is_public(cls: type, env_modules: Any) -> bool:
    """Whether ``cls`` is exported by one of the API packages (under any name)."""
    for modname in env_modules:
        module = sys.modules.get(modname)
        if module is not None and any(vars(module).get(n) is cls for n in getattr(module, "__all__", ())):
            return True
    return False


def public_bases(app: Sphinx, name: str, obj: Any, options: Any, bases: List[type]) -> None:
    """``autodoc-process-bases``: a private ``encoding`` base class (``_DataParallelBase``, a mixin) is replaced by its
    own bases, so that "Bases:" names only classes a reader can look up."""
    out: List[type] = []
    pending = list(bases)
    while pending:
        base = pending.pop(0)
        if (isinstance(base, type) and base.__module__.startswith("encoding")
                and not _is_public(base, app.config.encoding_api_modules)):
            pending[:0] = [b for b in base.__bases__ if b is not object]
        elif base not in out:
            out.append(base)
    bases[:] = out or [object]


def setup(app: Sphinx) -> Dict[str, Any]:
    """Register the directives, the autodoc hooks and the reference resolver."""
    app.add_config_value("encoding_api_modules", (), "env")
    app.add_directive("encoding-model-table", ModelTable)
    app.add_directive("encoding-api", ApiReference)
    app.add_directive("encoding-recipe-table", RecipeTable)
    app.add_directive("encoding-pe-zoo-table", PEZooTable)
    app.connect("builder-inited", reset_documented_names)
    app.connect("autodoc-skip-member", keep_public_members)
    app.connect("autodoc-process-docstring", document_reexported_data)
    app.connect("autodoc-process-bases", public_bases)
    app.connect("missing-reference", resolve_by_identity)
    return {"parallel_read_safe": True, "parallel_write_safe": True, "version": "1"}
