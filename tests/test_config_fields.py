"""Issue 33 item 1: every option of train/test/demo (and of the memory and export tools) is one field of
``encoding.config`` (no option without a field, no field restated), and ``resolve`` fills a run's settings in one order, recording each value's source."""
import argparse
import ast
import dataclasses
import os
import warnings

import pytest

import encoding
from conftest import SCRIPTS, load_script
from encoding.config import (AUX_WEIGHT_LIBRARY, NETWORK_OPTIONS, SCRIPTS as SCRIPT_NAMES, TrainingConfig,
                             build_parser, option_specs, recipe_file, resolve)
from encoding.config.fields import cli_name, option_fields
from encoding.config.parser import PROGS
from encoding.config.tools import TOOLS
from encoding.config.resolve import ORDER
from encoding.engine import state
from encoding.engine.assemble import ConfigError, check_network, check_resume, config_header, saved_config

ADE = ("dataset: ade20k\nmodel: encnet\nbackbone: resnet50\noutput-stride: 16\nepochs: 10\nbatch-size: 16\n"
       "lr: 0.004\noptimizer: sgd\nweight-decay: 0\n")


def _actions(parser):
    return [a for a in parser._actions if not isinstance(a, argparse._HelpAction)
            and a.dest not in ("config", "traceback")]  # where settings come from / how errors show: not settings


@pytest.mark.parametrize("script", SCRIPT_NAMES + TOOLS)
def test_traceback_is_listed_in_every_help(script):
    assert "--traceback" in build_parser(script).format_help()


def _tool_parser(tool):
    """The parser the tool itself builds (its ``cli.build_parser``)."""
    import importlib
    return importlib.import_module(f"encoding.{tool}.cli").build_parser()


@pytest.mark.parametrize("script", SCRIPT_NAMES + TOOLS)
def test_every_option_is_one_field_and_every_field_one_option(script):
    specs = {f.name: (f, o) for f, o in option_specs(script)}
    actions = _actions(build_parser(script) if script in SCRIPT_NAMES else _tool_parser(script))
    dests = [a.dest for a in actions]
    assert sorted(dests) == sorted(specs) and len(set(dests)) == len(dests)  # no option without a field, no twin
    for action in actions:
        f, o = specs[action.dest]
        spelling = o.per_script.get(script, {})
        assert action.help.startswith(spelling.get("help", o.help))  # the field's help (and its default)
        assert list(action.choices or ()) == list(spelling.get("choices", o.choices) or ())
        if o.parse is not None and "nargs" not in spelling:
            assert action.type is o.parse
        longs = [s for s in action.option_strings if s != o.old]
        assert longs == list(spelling.get("flags", o.flags)) or longs == [cli_name(f.name)] or not longs
        if script in TOOLS:  # no resolve after a tool's parser: it fills the field's default for the tool
            assert action.default == spelling.get("default", f.default)
        else:
            assert action.default is argparse.SUPPRESS or not action.option_strings  # resolve fills the rest


def test_no_field_is_restated_and_the_tools_share_the_network_fields():
    from encoding.config import GROUPS
    from encoding.config.tools import TOOL_GROUPS

    names = [f.name for f, _ in option_fields(*GROUPS.values(), *TOOL_GROUPS.values())]
    assert len(set(names)) == len(names)  # one field a name: a tool's option that train.py has is train.py's field
    train = {f.name: f for f, _ in option_specs("train")}
    for name in ("model", "backbone", "dataset", "aux", "se_loss", "crop_size", "batch_size", "recompute"):
        assert next(f for f, _ in option_specs("memory") if f.name == name) is train[name]
    assert next(f for f, _ in option_specs("export") if f.name == "resume") is train["resume"]
    assert set(PROGS) == set(SCRIPT_NAMES) | set(TOOLS)


def test_the_evaluation_config_is_made_from_test_py_s_fields_and_follows_its_rules():
    from encoding.config.evaluation import MODEL_SPECIFIC
    from encoding.inference.evaluation import EvaluationConfig

    made = {f.name: f for f in dataclasses.fields(EvaluationConfig)}
    specs = {f.name: f for f, _ in option_specs("test")}
    assert set(made) == set(specs) | {"inference"}
    for name, spec in specs.items():  # the option's default, but the network's own stride / head width
        assert made[name].default == (None if name in MODEL_SPECIFIC else spec.default), name
    assert made["mode"].default is None and EvaluationConfig().mode == "testval"  # test.py's rule, not a restated default
    assert EvaluationConfig(split="test", save_pred="p").mode == "test"
    assert EvaluationConfig(multi_scale=True).mode == "testval"
    slide = EvaluationConfig(inference="slide", crop_size=30)
    assert (slide.mode, slide.window, slide.stride) == ("testval", 30, 20)
    with pytest.raises(ConfigError, match="--window / --stride are options of --mode slide"):
        EvaluationConfig(window=8)


def test_the_memory_tools_recompute_keeps_checkpoint_as_its_old_spelling(capsys, tmp_path):
    from encoding.memory.cli import build_parser as memory_parser, parse_args

    assert memory_parser().parse_args(["--recompute", "backbone"]).recompute == "backbone"
    with pytest.warns(FutureWarning, match="--checkpoint is now --recompute"):
        assert parse_args(["--checkpoint", "all", "--model", "fcn", "--backbone", "resnet18", "--out-dir",
                           str(tmp_path)]).recompute == "all"
    assert "python -m encoding.memory: note: --checkpoint is now --recompute" in capsys.readouterr().err


def test_the_scripts_parser_is_the_library_parser_and_states_no_option():
    options = load_script("options")
    for script in SCRIPT_NAMES:
        ours = [(a.option_strings, a.dest) for a in options.build_parser(script)._actions]
        assert ours == [(a.option_strings, a.dest) for a in build_parser(script)._actions]
    source = open(os.path.join(SCRIPTS, "options.py"), encoding="utf-8").read()
    assert "add_argument" not in source and "MODEL_OPTIONS = NETWORK_OPTIONS" in source
    assert options.MODEL_OPTIONS is NETWORK_OPTIONS is encoding.inference.loading.NETWORK_OPTIONS
    assert NETWORK_OPTIONS == tuple(f.name for f, o in option_specs("train") if o.network)


def test_training_config_is_the_flat_view_of_the_train_fields():
    flat = [f for f in dataclasses.fields(TrainingConfig) if f.name not in ("sources", "config_file")]
    assert [(f.name, f.default) for f in flat] == [(f.name, f.default) for f, _ in option_specs("train")]
    assert TrainingConfig(epochs=2).epochs == 2 and TrainingConfig().sources == {}


def test_the_config_package_imports_no_engine():
    folder = os.path.dirname(encoding.config.__file__)
    for name in os.listdir(folder):
        if name.endswith(".py"):
            tree = ast.parse(open(os.path.join(folder, name), encoding="utf-8").read())
            modules = [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
            modules += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
            assert not [m for m in modules if "engine" in m], name


# --- the order: one test per source ----------------------------------------------------------------------------

def test_a_value_no_source_sets_is_the_fields_default(tmp_path):
    settings = resolve("train", [])
    assert settings.optim.momentum == 0.9 and settings.source("momentum") == "default"
    assert settings.source("model") == f"recipe {recipe_file('shapes')}"  # the package's shapes.yaml
    assert settings.model.model == TrainingConfig.model
    bare = resolve("train", [], recipes=str(tmp_path))  # a folder without shapes.yaml: the built-in recipe
    assert bare.source("model") == "recipe (built-in, shapes)" and bare.options() == settings.options()


def test_the_recipe_beats_the_default(tmp_path):
    (tmp_path / "ade20k.yaml").write_text(ADE)
    settings = resolve("train", ["--dataset", "ade20k"], recipes=str(tmp_path))
    assert (settings.optim.lr, settings.optim.optimizer, settings.model.output_stride) == (0.004, "sgd", 16)
    assert settings.source("lr") == f"recipe {tmp_path / 'ade20k.yaml'}"
    assert settings.source("momentum") == "default"


def test_the_config_file_beats_the_recipe(tmp_path):
    (tmp_path / "ade20k.yaml").write_text(ADE)
    (tmp_path / "run.yaml").write_text("dataset: ade20k\nlr: 0.01\n")
    settings = resolve("train", ["--config", str(tmp_path / "run.yaml")], recipes=str(tmp_path))
    assert settings.optim.lr == 0.01 and settings.source("lr") == f"config file {tmp_path / 'run.yaml'}"
    assert settings.optim.epochs == 10 and settings.source("epochs").startswith("recipe ")


def test_the_command_line_beats_the_config_file(tmp_path):
    (tmp_path / "run.yaml").write_text("lr: 0.01\nepochs: 3\n")
    settings = resolve("train", ["--lr", "0.02", "--config", str(tmp_path / "run.yaml")])
    assert (settings.optim.lr, settings.source("lr")) == (0.02, "command line")
    assert settings.optim.epochs == 3 and settings.source("epochs").startswith("config file")


def test_the_checkpoint_gives_the_network_the_command_line_leaves_unset(tmp_path):
    weights = tmp_path / "model_best.pth"
    weights.write_bytes(b"")
    recorded = {"dataset": "ade20k", "model": "fcn", "backbone": "resnet18", "aux": True, "crop_size": 96}
    read = lambda path, names: {k: recorded.get(k) for k in names}  # noqa: E731  (engine.state.saved_options)
    settings = resolve("test", ["--resume", str(weights), "--crop-size", "64"], read_saved=read)
    assert (settings.data.dataset, settings.model.model, settings.model.aux) == ("ade20k", "fcn", True)
    assert settings.source("model") == f"checkpoint {weights}" and settings.data.crop_size == 64
    assert settings.source("crop_size") == "command line" and settings.data.base_size == 520  # ade20k's own


def test_what_a_resumed_checkpoint_fixes_is_refused_not_replaced():
    saved = state.Checkpoint("ck.pth", {"args": {"optimizer": "sgd", "batch_size": 4}, "iteration": 3, "epoch": 0})
    with pytest.raises(ConfigError, match="--optimizer adamw: ck.pth was trained with --optimizer sgd"):
        check_resume(TrainingConfig(optimizer="adamw", batch_size=4), saved)
    with pytest.raises(ConfigError, match="--batch-size 8: ck.pth stopped after iteration 3"):
        check_resume(TrainingConfig(optimizer="sgd", batch_size=8), saved)
    assert list(ORDER) == ["default", "recipe", "checkpoint", "config file", "command line"]


# --- the rules ---------------------------------------------------------------------------------------------------

def test_each_conditional_default_is_one_rule_with_its_source(tmp_path):
    (tmp_path / "ade20k.yaml").write_text(ADE)
    pretrained = resolve("train", ["--pretrained-backbone"])
    assert pretrained.optim.head_lr_mult == 10.0 and pretrained.source("head_lr_mult").startswith("rule: ")
    assert resolve("train", ["--pretrained-backbone", "--head-lr-mult", "2"]).optim.head_lr_mult == 2.0
    assert resolve("train", []).optim.head_lr_mult == 1.0
    scaled = resolve("train", ["--dataset", "ade20k", "--batch-size", "8"], recipes=str(tmp_path))
    assert scaled.optim.lr == pytest.approx(0.002) and scaled.source("lr").startswith("rule: the recipe's lr")
    other = resolve("train", ["--dataset", "ade20k", "--model", "fcn"], recipes=str(tmp_path))
    assert other.model.output_stride is None and other.source("output_stride") == "default"  # not the recipe's model
    own = encoding.datasets.datasets["ade20k"]
    assert (other.data.base_size, other.data.crop_size) == (own.BASE_SIZE, own.CROP_SIZE)
    assert other.source("base_size") == "rule: ade20k's own"


def test_the_aux_weight_split_is_stated_once():
    assert TrainingConfig.aux_weight == 0.2 and AUX_WEIGHT_LIBRARY == 0.4
    import inspect
    assert inspect.signature(encoding.engine.builders.build_criterion).parameters["aux_weight"].default == AUX_WEIGHT_LIBRARY


def test_config_yaml_says_where_each_value_came_from():
    config = resolve("train", ["--lr", "0.01", "--resume", __file__]).training()
    header = config_header(config)
    assert "  lr: command line" in header and "resume" not in header.split("came from")[1]
    assert "sources" not in saved_config(config) and "config_file" not in saved_config(config)


# --- the recomputation option's new name -------------------------------------------------------------------------

def test_recompute_is_the_option_and_checkpoint_its_old_spelling(capsys, tmp_path):
    assert resolve("train", ["--recompute", "backbone"]).model.recompute == "backbone"
    with pytest.warns(FutureWarning, match="--checkpoint is now --recompute"):
        assert resolve("train", ["--checkpoint", "all"]).model.recompute == "all"
    assert "note: --checkpoint is now --recompute" in capsys.readouterr().err
    old_file = tmp_path / "config.yaml"  # a run's config.yaml written before the rename
    old_file.write_text("checkpoint: backbone\n")
    with pytest.warns(FutureWarning, match=f"--checkpoint is now --recompute \\(in {old_file}\\)"):
        assert resolve("train", ["--config", str(old_file)]).model.recompute == "backbone"
    with pytest.warns(FutureWarning, match=r"TrainingConfig\(checkpoint=...\) is now TrainingConfig\(recompute"):
        assert TrainingConfig(checkpoint="all").recompute == "all"
    with pytest.warns(FutureWarning, match=r"check_network\(checkpoint=...\) is now check_network\(recompute"):
        check_network("shapes", "fcn", "resnet18", checkpoint="backbone")
    with pytest.warns(FutureWarning, match=r"build_model\(checkpoint=...\)"):
        encoding.engine.builders.build_model("fcn", "shapes", backbone="resnet18", checkpoint="backbone")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        encoding.engine.builders.build_model("fcn", "shapes", backbone="resnet18", recompute="all")


def test_head_lr_mult_is_the_one_name_of_the_head_factor():
    import torch
    from encoding.utils.lr_scheduler import IterationLR

    def optimizer():
        return torch.optim.SGD([{"params": [torch.nn.Parameter(torch.zeros(1))]},
                                {"params": [torch.nn.Parameter(torch.zeros(1))]}], lr=0.1)

    new = IterationLR(optimizer(), "poly", 0.01, 2, 5, head_lr_mult=3.0)
    assert [g["lr"] for g in new.optimizer.param_groups] == pytest.approx([0.01, 0.03])
    with pytest.warns(FutureWarning, match="head_multiplier= is now head_lr_mult="):
        old = IterationLR(optimizer(), "poly", 0.01, 2, 5, head_multiplier=3.0)
    assert old.head_lr_mult == 3.0
    saved = dict(new.state_dict(), head_multiplier=3.0)  # a checkpoint written before the rename resumes
    del saved["head_lr_mult"]
    fresh = IterationLR(optimizer(), "poly", 0.01, 2, 5, head_lr_mult=1.0)
    fresh.load_state_dict(saved)
    assert fresh.head_lr_mult == 3.0


def test_read_recipe_needs_no_parser_and_the_old_call_still_works(tmp_path):
    from encoding.config import read_recipe

    (tmp_path / "ade20k.yaml").write_text(ADE)
    recipe = read_recipe(str(tmp_path), "ade20k")
    assert (recipe["model"], recipe["lr"], recipe["weight_decay"]) == ("encnet", 0.004, 0.0)
    with pytest.warns(FutureWarning, match=r"read_recipe\(parser, directory, dataset\) is now"):
        assert read_recipe(build_parser("train"), str(tmp_path), "ade20k") == recipe


@pytest.mark.parametrize("argv, owner", [
    (["--aux-weight", "0.5"], "--aux"), (["--se-weight", "0.5"], "--se-loss"),
    (["--momentum", "0.5"], "--optimizer sgd"), (["--lr-step", "3"], "--lr-scheduler step"),
    (["--threshold", "0.3"], "--binary / --binary-class"), (["--val-fraction", "0.2"], "--dataset folder"),
    (["--unknown-labels", "ignore"], "--dataset folder"), (["--log-images", "2"], "--tensorboard / --wandb"),
    (["--dist-timeout", "60"], "a torchrun launch")])
def test_an_option_asked_for_without_the_setting_it_belongs_to_is_refused(argv, owner, monkeypatch):
    """Accepted and read nowhere, these changed nothing: refused on the command line; with their setting, taken."""
    from encoding.config.resolve import ONLY_WITH, resolve

    with pytest.raises(ConfigError, match=f"^{' '.join(argv)} is an option of {owner}: here it would change nothing$"):
        resolve("train", argv)
    name = argv[0][2:].replace("-", "_")
    assert any(option.name == name for option in ONLY_WITH)
    enabling = {"--aux": ["--aux"], "--se-loss": ["--model", "encnet", "--se-loss"],
                "--optimizer sgd": ["--optimizer", "sgd"], "--lr-scheduler step": ["--lr-scheduler", "step"],
                "--binary / --binary-class": ["--binary", "--dataset", "folder", "--data-root", "d"],
                "--dataset folder": ["--dataset", "folder", "--data-root", "d"], "--tensorboard / --wandb": ["--wandb"],
                "a torchrun launch": []}[owner]
    if owner == "a torchrun launch":
        monkeypatch.setenv("RANK", "0")
        monkeypatch.setenv("WORLD_SIZE", "2")
    got = resolve("train", enabling + argv).options()[name]
    assert got == type(got)(argv[1])  # the value asked for, taken
