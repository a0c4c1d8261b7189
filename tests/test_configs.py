"""Issue 27 item 1: ``train.py --config FILE`` (YAML or JSON, keys = option names, typed by the script's parser, the
command line wins), the run's saved ``config.yaml`` that repeats it, and the dataset recipes as configuration files
(issue 44 item 3: shipped inside the package, so ``encoding.config.resolve`` and ``train.py`` read the same ones).
"""
import ast
import fnmatch
import json
import os
import sys

import pytest
import yaml

from conftest import ROOT, SCRIPTS, TINY, load_script
from encoding.datasets import datasets
from encoding.engine.assemble import RUN_CONFIG_NAME, ConfigError, TrainingConfig, saved_config
from encoding.config import RECIPE_DIR, recipe_file, resolve
from encoding.config.recipes import read_flat
from encoding.config.recipes import RECIPE_KEYS, builtin_recipe, read_recipe
from encoding.engine.data import image_sizes
from encoding.utils.configfile import read_config, write_config

CONFIGS = os.path.join(SCRIPTS, "configs")  # the other experiments of train.py --config
RECIPE_FILES = sorted(name[:-5] for name in os.listdir(RECIPE_DIR) if name.endswith(".yaml"))


@pytest.fixture(scope="module")
def options():
    sys.path.insert(0, SCRIPTS)
    try:
        return load_script("options")
    finally:
        sys.path.remove(SCRIPTS)


def _write(path, text):
    path.write_text(text)
    return str(path)


def _error(capsys, options, argv):
    with pytest.raises(SystemExit) as stop:
        options.parse_args(argv)
    err = capsys.readouterr().err
    assert stop.value.code == 2 and len(err.strip().splitlines()) == 1, err
    return err


def test_a_file_sets_options_as_the_command_line_would(tmp_path, options):
    path = _write(tmp_path / "run.yaml", "crop-size: 48\nbase_size: 56\nscale-range: [0.5, 1.5]\naux: true\n"
                                         "optimizer: sgd\nlr: 1e-3\nno-val: false\ncheckname: null\n")
    args = options.parse_args(["--config", path])
    assert (args.crop_size, args.base_size, args.scale_range, args.aux) == (48, 56, (0.5, 1.5), True)
    assert (args.optimizer, args.lr, args.no_val, args.checkname) == ("sgd", 1e-3, False, "default")
    assert vars(args) == vars(options.parse_args(["--crop-size", "48", "--base-size", "56", "--scale-range", "0.5,1.5",
                                                  "--aux", "--optimizer", "sgd", "--lr", "0.001"]))
    assert not hasattr(args, "config")  # TrainingConfig(**vars(args)) takes the options only
    TrainingConfig(**vars(args))
    wins = options.parse_args(["--crop-size", "40", "--config", path, "--lr", "0.01"])  # the command line wins
    assert (wins.crop_size, wins.lr, wins.base_size) == (40, 0.01, 56)
    json_path = _write(tmp_path / "run.json", json.dumps({"crop_size": 48, "aux": True}))
    assert options.parse_args(["--config", json_path]).crop_size == 48


@pytest.mark.parametrize("name,text,message", [
    ("typo.yaml", "crop-szie: 3\n", "unknown key 'crop-szie'; did you mean 'crop-size'?"),
    ("bad.yaml", "lr: -1\n", "argument --lr: must be > 0.0, got -1"),
    ("choice.json", '{"optimizer": "adam"}', "argument --optimizer: invalid choice: 'adam'"),
    ("flag.yml", "aux: 3\n", "key 'aux': --aux is a switch: expected true or false, got 3"),
    ("value.yaml", "epochs: true\n", "key 'epochs': --epochs takes a value, got True"),
    ("nested.yaml", "config: other.yaml\n", "key 'config' cannot be set in a file (a file does not name another"),
    ("shown.yaml", "traceback: true\n", "key 'traceback' cannot be set in a file (it is how errors are shown"),
    ("list.yaml", "- 1\n", "expected a mapping of option names to values, got list"),
    ("garbled.yaml", "a: [\n", "not valid YAML"),
    ("garbled.json", "{", "not valid JSON"),
    ("config.txt", "a: 1\n", "a configuration file is .yaml, .yml or .json"),
])
def test_a_bad_file_is_one_line_naming_the_file(tmp_path, capsys, options, name, text, message):
    path = _write(tmp_path / name, text)
    err = _error(capsys, options, ["--config", path])
    assert f"{path}: " in err and message in err


def test_a_missing_file_or_pyyaml_is_one_line(tmp_path, capsys, options, monkeypatch):
    assert "no such configuration file" in _error(capsys, options, ["--config", str(tmp_path / "none.yaml")])
    path = _write(tmp_path / "run.yaml", "epochs: 2\n")
    monkeypatch.setitem(sys.modules, "yaml", None)  # as without the `config` extra
    assert f"{path}: reading YAML needs PyYAML: pip install -e .[config]" in _error(capsys, options, ["--config", path])
    # the recipes are flat files, read without PyYAML: the built-in run and every dataset's start need none
    assert options.parse_args(["--dataset", "ade20k"]).model == read_recipe(RECIPE_DIR, "ade20k")["model"]
    assert options.parse_args([]).model == TrainingConfig.model


def test_written_config_reads_back_with_its_values(tmp_path):
    values = {"dataset": "shapes", "scale_range": (0.5, 2.0), "weight_decay": 1e-05, "data_root": None,
              "aux": True, "checkname": "a b: c", "lr": 0.002}
    path = write_config(str(tmp_path / "config.yaml"), values, header="a header")
    assert open(path).readline() == "# a header\n"
    data = read_config(path)
    assert list(data) == ["dataset", "scale-range", "weight-decay", "data-root", "aux", "checkname", "lr"]
    assert data["scale-range"] == [0.5, 2.0] and data["checkname"] == "a b: c" and data["data-root"] is None
    assert float(data["weight-decay"]) == 1e-05  # YAML 1.1 reads 1e-05 as text; the option's type makes it a float


def test_saved_config_records_the_run_not_what_to_do_with_its_directory():
    config = TrainingConfig(resume="a.pth", overwrite=True, eval=False)
    assert not {"resume", "overwrite", "eval"} & set(saved_config(config))
    assert saved_config(TrainingConfig(resume="a.pth", ft=True))["resume"] == "a.pth"  # fine-tuning starts from it


def _first_loss(run_dir):
    with open(os.path.join(run_dir, "log.jsonl")) as f:
        return json.loads(f.readline())["loss"]


def test_a_run_saved_config_repeats_the_run(tiny_shapes, tmp_path, options):
    """Acceptance: ``train.py --config X`` then ``--config RUN/config.yaml`` give the same first-epoch loss."""
    train = load_script("train")
    out = tmp_path / "runs"
    keys = dict(zip([a[2:] for a in TINY[::2]], TINY[1::2]))
    first = _write(tmp_path / "x.yaml", yaml.safe_dump({**keys, "deterministic": True, "output-dir": str(out),
                                                       "checkname": "first", "train-limit": 8}))
    train.main(["--config", first], datasets=tiny_shapes)
    run_dir = out / "shapes" / "unet" / "first"
    saved = str(run_dir / RUN_CONFIG_NAME)
    train.main(["--config", saved, "--checkname", "again"], datasets=tiny_shapes)
    again = out / "shapes" / "unet" / "again"
    assert _first_loss(again) == _first_loss(run_dir)
    assert {k: v for k, v in read_config(str(again / RUN_CONFIG_NAME)).items() if k != "checkname"} == {
        k: v for k, v in read_config(saved).items() if k != "checkname"}
    elsewhere = ["--checkname", "elsewhere"]  # a saved run's own directory is taken: a new run goes elsewhere
    assert vars(options.parse_args(["--config", saved] + elsewhere)) == vars(
        options.parse_args(["--config", first] + elsewhere))
    assert options.parse_args(["--config", saved, "--batch-size", "2"] + elsewhere).batch_size == 2
    # into its own directory, a run would write its config.yaml over the --config it reads (or --overwrite delete
    # it): refused, the file as it was
    before = open(saved, "rb").read()
    for more in (["--resume", str(run_dir / "checkpoint.pth"), "--epochs", "2"], ["--overwrite"]):
        with pytest.raises(ConfigError, match="that is this run's own config.yaml, which the run writes again"):
            train.main(["--config", saved] + more, datasets=tiny_shapes)
    assert open(saved, "rb").read() == before and (run_dir / "checkpoint.pth").exists()


def test_a_run_directory_config_the_command_line_overrides_wholly_is_still_refused(tiny_shapes, tmp_path):
    """The refusal asks which file ``--config`` read, not which values it gave: a hand-written ``config.yaml`` in a
    fresh run directory whose every value the command line overrides is no source, and was written over."""
    run_dir = tmp_path / "runs" / "shapes" / "unet" / "mine"
    run_dir.mkdir(parents=True)
    own = _write(run_dir / RUN_CONFIG_NAME, "epochs: 1\n")
    argv = ["--config", own, "--epochs", "2", "--output-dir", str(tmp_path / "runs"), "--checkname", "mine"]
    settings = resolve("train", argv)
    assert settings.config_file == own and settings.training().config_file == own
    assert not [s for s in settings.sources.values() if s.startswith("config file")]
    with pytest.raises(ConfigError, match="that is this run's own config.yaml, which the run writes again"):
        load_script("train").main(argv, datasets=tiny_shapes)
    assert open(own).read() == "epochs: 1\n" and os.listdir(run_dir) == [RUN_CONFIG_NAME]


@pytest.mark.parametrize("dataset", RECIPE_FILES)
def test_a_dataset_recipe_file_is_what_its_dataset_starts_from(options, dataset):
    path = recipe_file(dataset)
    assert path == os.path.join(RECIPE_DIR, f"{dataset}.yaml")
    assert {k.replace("-", "_") for k in read_config(path)} <= set(RECIPE_KEYS) | {"dataset"}
    assert vars(options.parse_args(["--dataset", dataset])) == vars(options.parse_args(["--config", path]))
    recipe = read_recipe(RECIPE_DIR, dataset)
    assert {k.replace("-", "_"): v for k, v in read_config(path).items()} == {  # PyYAML reads the same
        k.replace("-", "_"): v for k, v in read_flat(path).items()}
    args = options.parse_args(["--dataset", dataset])
    assert all(getattr(args, key) == recipe[key] for key in RECIPE_KEYS if recipe[key] is not None)


def test_every_dataset_has_a_recipe_file_and_the_builtin_one_is_the_defaults(options):
    assert set(RECIPE_FILES) == set(datasets)
    assert read_recipe(RECIPE_DIR, TrainingConfig.dataset) == builtin_recipe(TrainingConfig.dataset)  # shapes.yaml
    args = options.parse_args([])  # the built-in run: TrainingConfig's defaults (no PyYAML needed)
    assert {k: getattr(args, k) for k in RECIPE_KEYS} == builtin_recipe("shapes")
    effective = {**vars(TrainingConfig()), **image_sizes(TrainingConfig())}  # None sizes: the built-in run's
    assert {k: getattr(args, k) for k in RECIPE_KEYS} == {k: effective[k] for k in RECIPE_KEYS}


@pytest.mark.parametrize("dataset", RECIPE_FILES)
def test_the_python_api_resolves_what_train_py_resolves(options, dataset):
    """``encoding.config.resolve`` reads the package's recipes by default: the values and their sources are
    ``train.py``'s (``options.settings``), and the recipe is applied (not the fields' defaults)."""
    api = resolve("train", ["--dataset", dataset])
    script = options.settings(["--dataset", dataset])
    assert api.options() == script.options() and dict(api.sources) == dict(script.sources)
    assert api.source("model") == f"recipe {recipe_file(dataset)}"
    assert api.model.model == read_recipe(RECIPE_DIR, dataset)["model"]
    evaluation = ["--dataset", dataset, "--torchvision-weights"]  # test.py reads the same recipe
    assert resolve("test", evaluation).options() == options.settings(evaluation, "test").options()


def test_the_recipes_are_not_the_builtin_defaults_outside_shapes():
    """What went wrong before: without ``recipes=`` the API started ade20k from the fields' defaults (a U-Net)."""
    settings = resolve("train", ["--dataset", "ade20k"])
    assert (settings.model.model, settings.model.backbone, settings.optim.epochs) == ("encnet", "resnet50", 180)
    assert builtin_recipe("ade20k")["model"] != settings.model.model


def test_other_experiments_stay_in_experiments_and_run_with_config(options):
    """``configs/`` keeps the experiments that are not a dataset's recipe (no recipe there); ``--config`` runs them."""
    names = sorted(os.listdir(CONFIGS))
    assert "ade20k_segformer_mit_b0.yaml" in names and not {n[:-5] for n in names} & set(datasets)
    args = options.parse_args(["--config", os.path.join(CONFIGS, "ade20k_segformer_mit_b0.yaml")])
    assert (args.dataset, args.model, args.backbone, args.lr) == ("ade20k", "segformer", "mit_b0", 6e-5)
    assert args.epochs == 127 and options.settings(["--config", os.path.join(CONFIGS, "ade20k_segformer_mit_b0.yaml")]
                                                   ).source("epochs").startswith("config file ")


def test_a_missing_recipe_folder_is_refused_in_one_line(tmp_path):
    with pytest.raises(ConfigError, match=r"none: no such folder of dataset recipes \(the recipe of --dataset ade20k"):
        resolve("train", ["--dataset", "ade20k"], recipes=str(tmp_path / "none"))


def test_setup_ships_every_recipe_file_as_package_data():
    """A non-editable install carries the recipes: setup.py's package_data of encoding.config matches each file."""
    setup_py = os.path.join(ROOT, "setup.py")
    call = next(n for n in ast.walk(ast.parse(open(setup_py, encoding="utf-8").read()))
                if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "setup")
    package_data = ast.literal_eval(next(k.value for k in call.keywords if k.arg == "package_data"))
    package = os.path.dirname(RECIPE_DIR)
    files = [os.path.relpath(os.path.join(RECIPE_DIR, name), package) for name in os.listdir(RECIPE_DIR)]
    assert files and all(any(fnmatch.fnmatch(f, pattern) for pattern in package_data["encoding.config"])
                         for f in files)


def test_a_recipe_file_sets_only_recipe_keys(tmp_path, options):
    _write(tmp_path / "ade20k.yaml", "dataset: ade20k\nmodel: fcn\nbackbone: resnet50\nepochs: 2\nbatch-size: 2\n"
                                     "lr: 0.1\noptimizer: sgd\nweight-decay: 0\naux: true\n")
    with pytest.raises(ConfigError, match="ade20k.yaml: the recipe of --dataset ade20k sets aux, which a recipe"):
        read_recipe(str(tmp_path), "ade20k")
    _write(tmp_path / "citys.yaml", "dataset: citys\nmodel: fcn\n")
    with pytest.raises(ConfigError, match="citys.yaml: the recipe of --dataset citys lacks backbone, epochs"):
        read_recipe(str(tmp_path), "citys")
    assert read_recipe(str(tmp_path), "coco")["base_size"] is None  # no file: the dataset's own sizes


def test_a_recipe_learning_rate_scales_with_the_batch_size_when_lr_is_not_given(tmp_path):
    """PyTorch-Encoding's rule: the recipe's lr is for its batch; --batch-size without --lr scales it linearly."""
    from encoding.config import resolve

    _write(tmp_path / "ade20k.yaml", "dataset: ade20k\nmodel: fcn\nbackbone: resnet50\nepochs: 10\nbatch-size: 16\n"
                                     "lr: 0.004\noptimizer: sgd\nweight-decay: 0\n")

    def options(*given):
        return resolve("train", ["--dataset", "ade20k", *given], recipes=str(tmp_path)).training()

    scaled = options("--batch-size", "8")
    assert scaled.lr == pytest.approx(0.002)
    default = options()
    assert (default.batch_size, default.lr) == (16, 0.004)
    explicit = options("--batch-size", "8", "--lr", "0.01")
    assert explicit.lr == 0.01


def test_under_torchrun_the_recipe_learning_rate_follows_the_batch_of_the_whole_job(tmp_path, monkeypatch):
    """--batch-size is per process under torchrun: the rate is the recipe's for the job's batch, so 8 processes x
    --batch-size 2 train at the recipe's rate for 16, as one process with --batch-size 16 does."""
    from encoding.config import resolve

    _write(tmp_path / "ade20k.yaml", "dataset: ade20k\nmodel: fcn\nbackbone: resnet50\nepochs: 10\nbatch-size: 16\n"
                                     "lr: 0.004\noptimizer: sgd\nweight-decay: 0\n")

    def settings(*given):
        return resolve("train", ["--dataset", "ade20k", *given], recipes=str(tmp_path))

    single = settings("--batch-size", "16").training().lr
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "8")
    job = settings("--batch-size", "2")
    assert job.optim.lr == pytest.approx(single) == pytest.approx(0.004)
    assert job.source("lr") == "rule: the recipe's lr 0.004 x --batch-size 2 x 8 processes / 16"
    own = settings()  # the recipe's batch, in each of 8 processes: 8 x its rate
    assert own.optim.lr == pytest.approx(0.032)
    assert own.source("lr") == "rule: the recipe's lr 0.004 x its batch 16 x 8 processes / 16"
    assert settings("--batch-size", "2", "--lr", "0.01").optim.lr == 0.01


@pytest.mark.parametrize("value, expected", [(True, True), (False, False), ("weights/mit_b0.safetensors",
                                                                            "weights/mit_b0.safetensors")])
def test_an_option_with_an_optional_value_reads_back_from_a_config_file(tmp_path, monkeypatch, value, expected):
    """--pretrained-backbone [FILE]: true in a file is the bare option, false leaves it off, a string is the FILE
    (which must be there: checked before any work, not read)."""
    options = load_script("options")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "weights").mkdir()
    (tmp_path / "weights" / "mit_b0.safetensors").write_bytes(b"")
    path = tmp_path / "run.yaml"
    write_config(str(path), {"pretrained-backbone": value})
    args = options.parse_args(["--config", str(path), "--no-val"], script="train")
    assert args.pretrained == expected


def test_a_cpu_run_on_two_cores_loads_in_the_training_process(monkeypatch):
    """``--workers``: 0 by rule for a CPU run on at most 2 cores (loading processes would take the cores the step
    computes on), the field's 2 otherwise; a value given always wins."""
    import sys

    resolve_module = sys.modules["encoding.config.resolve"]
    from encoding.config import resolve

    monkeypatch.setattr(resolve_module.torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(resolve_module.os, "cpu_count", lambda: 2)
    settings = resolve("train", [])
    assert settings.options()["workers"] == 0 and settings.source("workers").startswith("rule: a CPU run on 2 cores")
    assert resolve("train", ["--workers", "3"]).options()["workers"] == 3
    assert resolve("test", ["--torchvision-weights", "--model", "fcn", "--dataset", "pascal_voc"]
                   ).options()["workers"] == 0
    monkeypatch.setattr(resolve_module.os, "cpu_count", lambda: 8)
    assert resolve("train", []).options()["workers"] == 2
    monkeypatch.setattr(resolve_module.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(resolve_module.torch.cuda, "is_available", lambda: True)
    assert resolve("train", []).options()["workers"] == 2  # a GPU run: loading overlaps the device's step
    assert resolve("train", ["--no-cuda"]).options()["workers"] == 0
    assert resolve("train", ["--device-ids", "cpu,cpu"]).options()["workers"] == 0
