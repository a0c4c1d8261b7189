"""What the configuration layers may and may not give: a recipe folder names no code without the opt-in, and
``test.py`` / ``demo.py`` evaluate the network their weights hold (no network option from the recipe)."""
import os
import sys

import pytest
import torch

from encoding.config import resolve
from encoding.config.recipes import RECIPE_DIR, recipe_path
from encoding.datasets import datasets
from encoding.engine.state import saved_options
from encoding.models import get_segmentation_model
from encoding.utils import save_checkpoint
from encoding.utils.trust import UntrustedCode


def test_a_recipe_folder_naming_code_is_refused_without_the_opt_in(tmp_path):
    """``resolve(recipes=DIR)``: someone's recipe is a configuration file like ``--config``'s."""
    text = open(recipe_path(RECIPE_DIR, "shapes")).read().replace("model: unet", "model: evilmod_recipe:build")
    assert "evilmod_recipe" in text
    (tmp_path / "shapes.yaml").write_text(text)
    with pytest.raises(UntrustedCode, match=r"recipe .*shapes\.yaml names code to run.*--trust-code"):
        resolve("train", [], recipes=str(tmp_path))
    assert "evilmod_recipe" not in sys.modules
    assert resolve("train", ["--trust-code"], recipes=str(tmp_path)).model.model == "evilmod_recipe:build"
    assert resolve("train", ["--model", "fcn"], recipes=str(tmp_path)).model.model == "fcn"  # overridden: not read


def test_evaluation_takes_no_network_option_from_the_recipe(tmp_path):
    """A checkpoint recording no output stride and no base size (docs/inference.md's hand-made one): test.py builds
    the network load_model builds (the model's own stride, the dataset's own base size), not the recipe's (stride 8,
    base 72: another network, with the same weight shapes)."""
    net = get_segmentation_model("unet", dataset="shapes", backbone="vgg_tiny")
    path = str(tmp_path / "model_best.pth")
    save_checkpoint({"model": net, "args": {"dataset": "shapes", "model": "unet", "backbone": "vgg_tiny",
                                            "crop_size": 64}}, path)
    for script, argv in (("test", []), ("demo", ["image.jpg"])):
        settings = resolve(script, ["--resume", path] + argv, read_saved=saved_options)
        assert settings.model.output_stride is None and settings.source("output_stride") == "default"
        assert settings.data.crop_size == 64 and settings.source("crop_size") == f"checkpoint {path}"
        assert settings.data.base_size == datasets["shapes"].BASE_SIZE != 72
        assert not any(source.startswith("recipe") for source in settings.sources.values()), settings.sources
    trained = resolve("train", [])
    assert (trained.model.output_stride, trained.data.base_size) == (8, 72)  # what the recipe would have given
    assert torch.load(path, weights_only=True)["args"].get("output_stride") is None


@pytest.mark.parametrize("argv", [["--val-limit", "4"], ["--test-batch-size", "3"], ["--val-split", "nowhere"],
                                  ["--tensorboard", "--log-images", "2"]])
def test_validation_options_are_refused_with_no_val(argv):
    """``--no-val`` turns validation off: its options would change nothing (``--eval`` still reads them)."""
    from encoding.config import ConfigError

    asked = " ".join(argv[-2:])
    with pytest.raises(ConfigError, match=f"^{asked} is an option of validation, which --no-val turns off: "):
        resolve("train", ["--no-val"] + argv)
    assert resolve("train", argv) is not None


def test_a_config_file_option_its_own_settings_leave_unused_is_refused_as_on_the_command_line(tmp_path):
    """``momentum`` with ``optimizer: adamw`` in a ``--config`` file was taken and read nowhere (refused only on the
    command line). Refused where the file's settings leave it unused and its value is not the run's own without the
    file (a saved ``config.yaml`` records every value: it still repeats its run); a command line that changes the
    setting overrides the file."""
    from encoding.config import ConfigError
    from encoding.utils.configfile import write_config

    write_config(str(tmp_path / "mine.yaml"), {"optimizer": "adamw", "momentum": 0.5})
    with pytest.raises(ConfigError, match=r"^--momentum 0\.5 \(config file .*mine\.yaml\) is an option of "
                                          "--optimizer sgd: here it would change nothing$"):
        resolve("train", ["--config", str(tmp_path / "mine.yaml")])
    assert resolve("train", ["--config", str(tmp_path / "mine.yaml"), "--optimizer", "sgd"]).optim.momentum == 0.5
    write_config(str(tmp_path / "sgd.yaml"), {"optimizer": "sgd", "momentum": 0.5})
    assert resolve("train", ["--config", str(tmp_path / "sgd.yaml"), "--optimizer", "adamw"]).optim.optimizer == "adamw"
    for argv in (["--optimizer", "adamw"], ["--no-val", "--batch-size", "4"], ["--lr-scheduler", "cos"]):
        saved = resolve("train", argv)  # a run's config.yaml: every value, the unused ones at their defaults
        write_config(str(tmp_path / "run.yaml"), saved.options())
        assert resolve("train", ["--config", str(tmp_path / "run.yaml")]).options() == saved.options()
    write_config(str(tmp_path / "noval.yaml"), {"no-val": True, "batch-size": 4, "test-batch-size": 8})
    with pytest.raises(ConfigError, match="^--test-batch-size 8 .* is an option of validation, which --no-val"):
        resolve("train", ["--config", str(tmp_path / "noval.yaml")])


@pytest.mark.parametrize("argv", [["--lr", "0.5"], ["--epochs", "3"], ["--clip-grad", "1"], ["--no-val"],
                                  ["--weight-decay", "0.001"], ["--train-limit", "4"]])
def test_training_options_are_refused_with_eval(argv):
    """``train.py --eval`` evaluates the checkpoint and trains nothing: the options of training were accepted and read
    nowhere (``--no-val`` too, which contradicts it). Its validation options apply; a saved ``config.yaml`` given
    with ``--eval`` still evaluates (its training values are the run's record)."""
    from encoding.config import ConfigError

    with pytest.raises(ConfigError, match=f"^{argv[-1] if argv[-1] == '--no-val' else ' '.join(argv[-2:])} is an "
                                          "option of training, which --eval skips: here it would change nothing$"):
        resolve("train", ["--eval", "--resume", "model.pth"] + argv)
    assert resolve("train", argv) is not None
    assert resolve("train", ["--eval", "--resume", "model.pth", "--val-limit", "3", "--test-batch-size", "2"])


def test_a_saved_config_evaluates_with_eval(tmp_path):
    from encoding.utils.configfile import write_config

    saved = resolve("train", ["--epochs", "3", "--lr", "0.01", "--optimizer", "sgd", "--momentum", "0.8"])
    write_config(str(tmp_path / "config.yaml"), saved.options())
    settings = resolve("train", ["--config", str(tmp_path / "config.yaml"), "--eval", "--resume", "model.pth"])
    assert settings.run.eval and settings.optim.epochs == 3


@pytest.mark.parametrize("argv, has", [(["--crop-size", "48"], "has 32"), (["--base-size", "64"], "has 40"),
                                       (["--scale-range", "0.5,2"], None), (["--skip-bad"], "has False"),
                                       (["--train-split", "val"], "has 'train'")])
def test_options_that_build_datasets_are_refused_with_given_datasets_built_otherwise(argv, has, tiny_shapes, tmp_path):
    """``train.main(argv, datasets=(train, val))``: the options that build a dataset were accepted, read nowhere
    and recorded in the run's config.yaml (samples of 64 pixels under ``crop-size: 32``). Refused where the given
    datasets were built otherwise (or cannot say); the same values as theirs are taken, as a hand-built config's."""
    from conftest import TINY, load_script
    from encoding.config import ConfigError
    from encoding.engine import TrainingConfig, run_training

    train = load_script("train")
    out = ["--output-dir", str(tmp_path / "runs")]
    with pytest.raises(ConfigError, match=f"^{argv[0]} .*the datasets given to the run are built already"
                                          + (f" \\(the given ShapesSegmentation {has}\\)" if has else ";")):
        train.main(TINY + out + argv, datasets=tiny_shapes)
    with pytest.raises(ConfigError, match="^--crop-size 48: the datasets given"):
        run_training(TrainingConfig(crop_size=48, output_dir=str(tmp_path / "runs")), datasets=tiny_shapes)
    assert not (tmp_path / "runs").exists()


def test_a_missing_pretrained_backbone_file_is_refused_before_any_work(tmp_path):
    """It was found only when the network was built, after the run directory was made and the data loaded, in a
    message naming no option."""
    from encoding.config import ConfigError
    from encoding.engine.assemble import check_settings

    missing = tmp_path / "none.pth"
    with pytest.raises(ConfigError, match=rf"^--pretrained-backbone {missing}: no such weights file"):
        check_settings(resolve("train", ["--pretrained-backbone", str(missing)]))
    assert not os.listdir(tmp_path)
    missing.write_bytes(b"not read by the check")
    check_settings(resolve("train", ["--pretrained-backbone", str(missing)]))


@pytest.mark.parametrize("argv", [["--model", "unet", "--backbone", "vgg_tiny_s2"], ["--model", "fcn"],
                                  ["--model", "unet", "--output-stride", "16", "--crop-size", "96"]])
def test_the_memory_tool_plans_the_network_and_crop_train_py_runs(argv):
    """The same flags, the same network: the recipe's crop, and its output stride for the recipe's own model (the
    tool planned the dataset's crop 128 and the model's own stride 16 where training runs crop 64 at stride 8)."""
    from encoding.memory.cli import parse_args

    planned = parse_args(["--dataset", "shapes", "--simulate", "2"] + argv)
    trained = resolve("train", ["--dataset", "shapes"] + argv)
    assert (planned.output_stride, planned.head_channels, planned.crop_size) == (
        trained.model.output_stride, trained.model.head_channels, trained.data.crop_size)
    assert planned.crop_size != datasets["shapes"].CROP_SIZE


def test_a_spec_network_that_cannot_take_pretrained_backbone_is_refused_before_any_work(tmp_path, monkeypatch):
    """The refusals of the build (a factory without the keyword, a torchvision builder given a file) are found by
    the check, nothing built, loaded or downloaded; one the build takes passes."""
    from encoding.config import ConfigError
    from encoding.engine.assemble import check_settings

    (tmp_path / "nokw_factory.py").write_text("from torch import nn\n\ndef build(num_classes, width=8):\n"
                                              "    return nn.Conv2d(3, num_classes, 1)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    weights = tmp_path / "backbone.pth"
    weights.write_bytes(b"")
    for argv, says in ((["--model", "nokw_factory:build", "--pretrained-backbone", "--trust-code"],
                        "takes no option pretrained_backbone; the factory takes width"),
                       (["--model", "torchvision:fcn_resnet50", "--pretrained-backbone", str(weights)],
                        "only torchvision's own backbone weights")):
        with pytest.raises(ConfigError, match=says):
            check_settings(resolve("train", argv))
    check_settings(resolve("train", ["--model", "torchvision:lraspp_mobilenet_v3_large", "--pretrained-backbone"]))
