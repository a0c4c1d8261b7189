"""One place decides a run's settings: :func:`resolve` reads every source once, in one order, and says where each
value came from.

The order (a later source wins):

1. **default**: the option field's default (:mod:`.groups`);
2. **recipe**: the dataset's recipe file (:mod:`.recipes`; those shipped with the package unless ``recipes=``
   names another folder), for the options it sets;
3. **checkpoint** (``test.py`` / ``demo.py``): the network options recorded with the weights (``--resume``'s
   checkpoint, a ``--model-zoo`` preset) fill the network options that the file and the command line leave unset;
4. **config file**: ``train.py --config FILE``;
5. **command line**;
6. **what a resumed checkpoint fixes**: ``train.py --resume`` continues the saved optimizer and, in the middle of an
   epoch, its batch; :func:`encoding.engine.assemble.check_resume` refuses another value when the run starts (the
   checkpoint is read once, then) rather than silently replacing it.

Then the rules, each applied once, here and nowhere else (:data:`RULES`):

* ``lr``: a recipe's rate is for its batch, the batch of one step of the whole job: without ``--lr`` it scales
  linearly with ``--batch-size`` (PyTorch-Encoding's ``lr = recipe lr / recipe batch * batch``) and, under
  ``torchrun``, where the batch is per process, with the processes (``WORLD_SIZE``);
* ``head_lr_mult``: unless given, 10 with ``--pretrained-backbone`` (PE's), else 1;
* ``output_stride``, ``head_channels``: the recipe's only for the recipe's own model, else the model's (``None``);
* ``base_size``, ``crop_size``, ``scale_range``: unset, the dataset's own (``BASE_SIZE``, ``CROP_SIZE``,
  ``SCALE_RANGE`` of its class);
* ``warmup_epochs``: unset (a recipe without ``warmup-epochs``), no warm-up (PyTorch-Encoding's default);
* ``test_batch_size``: unset, ``--batch-size`` (``test.py``: 16);
* ``test.py`` / ``demo.py``: ``--scales`` PE's for the dataset; ``--mode`` and the slide window (:mod:`.evaluation`).
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Callable, Dict, List, Mapping, NamedTuple, Optional, Sequence, Tuple

import torch

from ..datasets import datasets as DATASETS
from ..names import is_model_spec
from ..utils.configfile import ConfigFileError, parse_config, read_config
from ..utils.dist import launched_by_torchrun, launched_world_size
from ..utils.trust import check_trusted
from .errors import ConfigError
from .evaluation import MODEL_SPECIFIC, NETWORK_OPTIONS, evaluation_rules, weights_layer
from .fields import cli_name
from .groups import (DataOptions, DemoOptions, DeviceOptions, EvalOptions, GROUPS, ModelOptions, OptimOptions,
                     RunOptions, WeightOptions)
from .parser import build_parser, option_specs, warn_old_spellings
from .recipes import RECIPE_DIR, SIZE_KEYS, read_recipe, recipe_source
from .training import TrainingConfig

__all__ = ["ORDER", "RULES", "Settings", "resolve", "parse_layers", "recipe_defaults"]

#: The sources of a setting, lowest first (the names :attr:`Settings.sources` uses, besides ``rule: ...``).
ORDER = ("default", "recipe", "checkpoint", "config file", "command line")
#: The options whose value a rule decides when no source sets them.
RULES = ("lr", "head_lr_mult", "output_stride", "head_channels", "base_size", "crop_size", "scale_range",
         "warmup_epochs", "test_batch_size", "workers", "scales", "mode", "window", "stride")
#: A CPU run on at most this many cores loads its data in the training process (``--workers 0``) unless a source
#: sets ``--workers``: loading processes would take the cores the step computes on (the default run: 137 s with
#: 0 workers against 154 s with 2, the same figures, on 2 idle cores).
FEW_CORES = 2


@dataclass(frozen=True)
class Settings:
    """A run's resolved settings, by group, and where each non-default value came from.

    Attributes:
        script: ``train``, ``test`` or ``demo``.
        sources: option name -> ``"recipe <path>"``, ``"checkpoint <path>"``, ``"config file <path>"``,
            ``"command line"`` or ``"rule: <why>"`` (an option absent here has its default).
        config_file: the ``--config`` file read (``None``: none), even where the command line overrides all of it.
    """

    script: str
    model: ModelOptions
    data: DataOptions
    optim: OptimOptions
    devices: DeviceOptions
    run: RunOptions
    weights: WeightOptions
    eval: EvalOptions
    demo: DemoOptions
    sources: Mapping[str, str]
    config_file: Optional[str] = None

    def options(self) -> Dict[str, Any]:
        """The script's options by name (``test.py`` adds ``inference``: ``whole`` or ``slide``)."""
        values = {f.name: getattr(getattr(self, group), f.name) for group, cls in GROUPS.items()
                  for f in dataclasses.fields(cls)}
        names = [f.name for f, _ in option_specs(self.script)] + (["inference"] if self.script == "test" else [])
        return {name: values[name] for name in names}

    def namespace(self) -> argparse.Namespace:
        """:meth:`options` as an ``argparse.Namespace`` (what the scripts' ``parse_args`` returns)."""
        return argparse.Namespace(**self.options())

    def training(self) -> Any:
        """The flat :class:`~.training.TrainingConfig` of ``train.py``'s settings, with :attr:`sources`."""
        return TrainingConfig(**self.options(), sources=dict(self.sources), config_file=self.config_file)

    def source(self, name: str) -> str:
        """Where the value of ``name`` came from (``"default"`` when no source set it)."""
        return self.sources.get(name, "default")


Layer = Tuple[str, Dict[str, Any]]


def parse_layers(script: str, argv: Sequence[str]) -> Tuple[Dict[str, Any], Optional[str], Dict[str, Any]]:
    """The options the command line sets, the ``--config`` file it names and the options that file sets (only
    what each gives: the parser leaves the rest unset).

    Raises:
        SystemExit: a bad option on the command line (argparse's one line, status 2).
        ConfigError: a file that cannot be used (naming it).
    """
    parser = build_parser(script)
    cli = vars(parser.parse_args(list(argv)))
    path = cli.pop("config", None)
    warn_old_spellings(script, argv)
    if path is None:
        return cli, None, {}
    try:
        filed = vars(parse_config(parser, path))
        warn_old_spellings(script, ["--" + str(k).replace("_", "-") for k in read_config(path)], f"in {path}")
    except ConfigFileError as err:
        raise ConfigError(str(err)) from None
    return cli, path, filed


def resolve(script: str = "train", argv: Optional[Sequence[str]] = None, *, recipes: Optional[str] = None,
            read_saved: Optional[Callable[[str, Sequence[str]], Mapping[str, Any]]] = None) -> Settings:
    """The settings of ``script`` run with ``argv`` (default: ``sys.argv[1:]``), in the order of this module.

    Args:
        recipes: the folder of the dataset recipes (``None``: :data:`~.recipes.RECIPE_DIR`, the recipes shipped
            with the package, which ``train.py`` reads too); a dataset without a file there starts from its
            built-in recipe (:func:`~.recipes.builtin_recipe`).
        read_saved: ``(checkpoint path, names) -> recorded values``
            (:func:`encoding.inference.evaluation.weights_options`): how ``test.py`` / ``demo.py`` read the network
            options of ``--resume``.

    Raises:
        SystemExit: a bad option on the command line (status 2).
        ConfigError: a file that cannot be used, or a value no source can give (one line).
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    cli, path, filed = parse_layers(script, argv)
    if path is not None:  # a config file (someone's, shared) names code: run only with the command line's opt-in
        check_trusted({k: v for k, v in filed.items() if k not in cli}, f"config file {path}",
                      bool(cli.get("trust_code")))
    given = {**filed, **cli}
    layers: List[Layer] = [("default", _defaults(script))]
    saved = weights_layer(script, given, read_saved)
    dataset = given.get("dataset") or saved[1].get("dataset") or layers[0][1]["dataset"]
    if dataset not in DATASETS:
        raise ConfigError(f"--dataset {dataset}: unknown dataset; valid: {', '.join(sorted(DATASETS))}")
    recipes = recipes or RECIPE_DIR
    recipe = read_recipe(recipes, dataset)
    # a recipe is a configuration file (someone's folder with recipes=): code it names runs only with the opt-in
    check_trusted({k: v for k, v in recipe.items() if k not in given}, recipe_source(recipes, dataset),
                  bool(cli.get("trust_code")))
    layers.append((recipe_source(recipes, dataset), _recipe_values(script, recipe, given, saved[1])))
    layers += [saved, (f"config file {path}", filed), ("command line", cli)]
    values: Dict[str, Any] = {}
    sources: Dict[str, str] = {}
    names = {f.name for f, _ in option_specs(script)}
    views: Dict[str, Dict[str, Any]] = {}  # the values before the config file's and before the command line's
    for source, layer in layers:
        views.setdefault(source.split(" ")[0], dict(values))
        for name, value in layer.items():
            if name in names:
                values[name] = value
                if source != "default":
                    sources[name] = source
    _refuse_spec_backbone(values, sources, recipe)
    if script == "train":
        _refuse_unused(values, sources, views["config"], views["command"])
    _rules(script, values, sources, recipe, given)
    return _settings(script, values, sources, path)


def _defaults(script: str) -> Dict[str, Any]:
    """Layer 1: each option's default in ``script`` (a script's own default first); a recipe's option has none
    (``None``: the recipe layer, or the model's or the dataset's own, decides)."""
    return {f.name: None if o.recipe else o.per_script.get(script, {}).get("default", f.default)
            for f, o in option_specs(script)}


def _recipe_values(script: str, recipe: Dict[str, Any], given: Dict[str, Any],
                   saved: Dict[str, Any]) -> Dict[str, Any]:
    """Layer 2: the values the recipe sets (``None``: left to the model or the dataset); the model-specific ones only
    for the recipe's own model (rule). ``test.py`` / ``demo.py`` evaluate the weights' network: its options other
    than the names (:data:`WEIGHTS_OWN`) are what the weights record, else the network's and the dataset's own, as
    :func:`~encoding.inference.loading.load_model` builds it, never the recipe's (dilations and sizes change no
    weight's shape: the recipe's would evaluate another network than the one trained)."""
    model = given.get("model") or saved.get("model") or recipe["model"]
    own = WEIGHTS_OWN if script != "train" else ()
    spec = is_model_spec(model)  # its own network: no backbone of the toolkit's, none from a recipe
    return {k: v for k, v in recipe.items() if v is not None and k not in own and not (spec and k == "backbone")
            and (k not in MODEL_SPECIFIC or model == recipe["model"])}


def recipe_defaults(dataset: str, model: str, recipes: Optional[str] = None) -> Dict[str, Any]:
    """What ``train.py --dataset DATASET --model MODEL`` takes from the dataset's recipe (the model-specific options
    only for the recipe's own model; ``None`` values left out): what the other tools (the memory tool) plan with.

    Raises:
        ConfigError: an unreadable recipe (naming the file).
    """
    return _recipe_values("train", read_recipe(recipes or RECIPE_DIR, dataset), {"model": model}, {})


def _refuse_spec_backbone(values: Dict[str, Any], sources: Dict[str, str], recipe: Dict[str, Any]) -> None:
    """A model spec is its own network, with no backbone of the toolkit's: one asked for on the command line or in a
    ``--config`` file is refused (it would change nothing). The recipe's backbone in a file is what a spec run's
    config.yaml recorded before the recipe's backbone stopped applying to specs: left unused, as it was then.

    Raises:
        ConfigError: naming the backbone, where it came from and the spec.
    """
    source = sources.get("backbone", "")
    if not (is_model_spec(values.get("model")) and values.get("backbone")) or \
            not source.startswith(("command line", "config file")):
        return
    if source.startswith("config file") and values["backbone"] == recipe.get("backbone"):
        return
    where = "" if source == "command line" else f" ({source})"
    raise ConfigError(f"--backbone {values['backbone']}{where}: the model spec {values['model']} has no backbone of "
                      "the toolkit's (drop it; a factory's own options go to the factory)")


#: The network options ``test.py`` / ``demo.py`` never take from a recipe (:func:`_recipe_values`).
WEIGHTS_OWN = tuple(name for name in NETWORK_OPTIONS if name not in ("dataset", "model", "backbone"))


def _rule(values: Dict[str, Any], sources: Dict[str, str], name: str, value: Any, why: str) -> None:
    values[name] = value
    sources[name] = f"rule: {why}"


class OnlyWith(NamedTuple):
    """An option of ``train.py`` that applies only with another setting (:data:`ONLY_WITH`)."""

    name: str
    applies: Callable[[Mapping[str, Any]], bool]  # of the resolved values
    owner: str  # the setting it belongs to, as the refusal names it
    in_files: bool = True  # refused in a ``--config`` file too (see :func:`_refuse_unused`)


#: ``train.py``'s options that ``--eval`` (evaluate the checkpoint, train nothing) never reads.
EVAL_SKIPS = ("loss", "aux_weight", "se_weight", "class_weights", "epochs", "start_epoch", "lr", "lr_scheduler",
              "lr_step", "warmup_epochs", "head_lr_mult", "optimizer", "momentum", "weight_decay", "clip_grad",
              "train_split", "train_limit", "scale_range", "verify_data", "no_val", "ft", "overwrite", "tensorboard",
              "wandb", "log_images")

#: ``train.py``'s options that apply only with another setting. Asked for without it they would change nothing: on
#: the command line they are refused; in a ``--config`` file too where the file's own settings leave them unused
#: (not the launch's, not ``--eval``'s: a run's saved ``config.yaml`` repeats the run under ``torchrun`` or not and
#: evaluates its checkpoint with ``--eval``).
ONLY_WITH = (OnlyWith("aux_weight", lambda v: v["aux"], "--aux"),
             OnlyWith("se_weight", lambda v: v["se_loss"], "--se-loss"),
             OnlyWith("momentum", lambda v: v["optimizer"] == "sgd", "--optimizer sgd"),
             OnlyWith("lr_step", lambda v: v["lr_scheduler"] == "step", "--lr-scheduler step"),
             OnlyWith("threshold", lambda v: v["binary"] or v["binary_class"] is not None, "--binary / --binary-class"),
             OnlyWith("val_fraction", lambda v: v["dataset"] == "folder", "--dataset folder"),
             OnlyWith("unknown_labels", lambda v: v["dataset"] == "folder", "--dataset folder"),
             OnlyWith("log_images", lambda v: v["tensorboard"] or v["wandb"], "--tensorboard / --wandb"),
             OnlyWith("dist_timeout", lambda v: launched_by_torchrun(), "a torchrun launch", in_files=False),
             *(OnlyWith(name, lambda v: not v["no_val"] or v["eval"], "validation, which --no-val turns off")
               for name in ("val_split", "val_limit", "test_batch_size", "log_images")),
             *(OnlyWith(name, lambda v: not v["eval"], "training, which --eval skips", in_files=False)
               for name in EVAL_SKIPS))


def _refuse_unused(values: Dict[str, Any], sources: Dict[str, str], before_file: Dict[str, Any],
                   file_view: Dict[str, Any]) -> None:
    """Refuse :data:`ONLY_WITH`'s options asked for where they change nothing: on the command line; in the
    ``--config`` file, where the file's settings leave them unused as the final ones do and the value is not the
    one the run takes without the file (a run's saved ``config.yaml`` records every value, the unused ones at their
    defaults). ``before_file``, ``file_view``: the values before the file was read, and after it."""
    for option in ONLY_WITH:
        source, value = sources.get(option.name, ""), values[option.name]
        if option.applies(values) or not (source == "command line" or (
                option.in_files and source.startswith("config file") and not option.applies(file_view)
                and value != _without_file(option.name, before_file, file_view))):
            continue
        items = value if isinstance(value, (tuple, list)) else [value]
        shown = "" if isinstance(value, bool) else " " + ",".join(f"{v:g}" if isinstance(v, float) else str(v)
                                                                  for v in items)
        where = "" if source == "command line" else f" ({source})"
        raise ConfigError(f"{cli_name(option.name)}{shown}{where} is an option of {option.owner}: here it would "
                          "change nothing")


def _without_file(name: str, before_file: Dict[str, Any], file_view: Dict[str, Any]) -> Any:
    """The value of ``name`` without the config file's (``test_batch_size``: its rule's, the batch size)."""
    if name == "test_batch_size" and before_file[name] is None:
        return file_view["batch_size"]
    return before_file[name]


def _rules(script: str, values: Dict[str, Any], sources: Dict[str, str], recipe: Dict[str, Any],
           given: Dict[str, Any]) -> None:
    """The documented rules of :data:`RULES`, each applied once."""
    if script == "train":
        _lr_rule(values, sources, recipe, given)
        if "head_lr_mult" not in given and values["pretrained"]:
            _rule(values, sources, "head_lr_mult", 10.0, "10 with --pretrained-backbone (PyTorch-Encoding's)")
        if values["warmup_epochs"] is None:
            _rule(values, sources, "warmup_epochs", 0, "no warm-up: the recipe sets none")
        if values["test_batch_size"] is None:
            _rule(values, sources, "test_batch_size", values["batch_size"], "--batch-size")
    if "workers" in values and "workers" not in sources and _cpu_run(values) and (os.cpu_count() or 1) <= FEW_CORES:
        _rule(values, sources, "workers", 0, f"a CPU run on {os.cpu_count()} cores loads in the training process")
    for name in MODEL_SPECIFIC:
        if name not in sources:  # no source: the model's own
            values[name] = None
    data = DATASETS[values["dataset"]]
    for name in (n for n in SIZE_KEYS if n in values and values[n] is None and data is not None):
        own = getattr(data, name.upper(), None)
        if own is not None:
            _rule(values, sources, name, tuple(own) if name == "scale_range" else own, f"{values['dataset']}'s own")
    if script != "train":
        evaluation_rules(script, values, sources, _rule)
    if values.get("scale_range") and (len(values["scale_range"]) != 2
                                      or values["scale_range"][0] > values["scale_range"][1]):
        raise ConfigError(f"--scale-range {','.join(map(str, values['scale_range']))}: expected MIN,MAX with "
                          "MIN <= MAX")


def _lr_rule(values: Dict[str, Any], sources: Dict[str, str], recipe: Dict[str, Any], given: Dict[str, Any]) -> None:
    """A recipe's lr is for its batch, the batch of one step of the whole job: without ``--lr`` it scales with the
    job's batch, ``--batch-size`` (or the recipe's) x the ``torchrun`` processes, each of which takes that batch."""
    processes = launched_world_size()
    if "lr" in given or not (recipe.get("lr") and recipe.get("batch_size")) or \
            ("batch_size" not in given and processes == 1):
        return
    batch = f"--batch-size {values['batch_size']}" if "batch_size" in given else f"its batch {values['batch_size']}"
    job = f"{batch} x {processes} processes" if processes > 1 else batch
    _rule(values, sources, "lr", recipe["lr"] * values["batch_size"] * processes / recipe["batch_size"],
          f"the recipe's lr {recipe['lr']:g} x {job} / {recipe['batch_size']}")


def _cpu_run(values: Dict[str, Any]) -> bool:
    """Whether the run computes on the CPU: ``--no-cuda``, CPU device ids, or no CUDA device."""
    ids = [i.strip() for i in str(values.get("device_ids") or "").split(",") if i.strip()]
    return bool(values.get("no_cuda")) or (bool(ids) and all(i.startswith("cpu") for i in ids)) or \
        not torch.cuda.is_available()


def _settings(script: str, values: Dict[str, Any], sources: Dict[str, str], config_file: Optional[str]) -> Settings:
    groups = {}
    for name, cls in GROUPS.items():
        own = {f.name: values[f.name] for f in dataclasses.fields(cls) if f.name in values}
        groups[name] = cls(**own)
    return Settings(script=script, sources=MappingProxyType(dict(sources)), config_file=config_file, **groups)


def describe_sources(sources: Mapping[str, str]) -> List[str]:
    """``config.yaml``'s record of where each non-default value came from, one line per option."""
    return [f"  {cli_name(name)[2:]}: {source}" for name, source in sources.items()]
