"""Hostile ``--config`` files (YAML alias bombs, binary, deeply nested, huge): refused quickly in one line naming
the file (issue 35).
"""
import pytest


LAUGHS = "a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
    f"{n}: &{n} [{', '.join(['*' + p] * 9)}]\n" for p, n in zip("abcdefgh", "bcdefghi"))


def _config_error(parser, path):
    from encoding.utils.configfile import ConfigFileError, expand_config

    with pytest.raises(ConfigFileError) as err:
        expand_config(parser, ["--config", str(path)])
    message = str(err.value)
    assert "\n" not in message and len(message) < 600 and str(path) in message
    return message


@pytest.fixture
def train_parser():
    from encoding.utils.cli import OneLineParser

    p = OneLineParser(prog="train.py")
    p.add_argument("--config")
    p.add_argument("--scales", default=None)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--aux", action="store_true")
    return p


@pytest.mark.parametrize("text", [LAUGHS, LAUGHS.replace("i: &i", "scales:"), LAUGHS.replace("i: &i", "aux:"),
                                  LAUGHS.replace("i: &i", "lr:")])
def test_yaml_nested_aliases_are_refused_quickly(text, tmp_path, train_parser):
    import time

    path = tmp_path / "laughs.yaml"
    path.write_text(text)
    started = time.perf_counter()
    assert "expands to more than" in _config_error(train_parser, path)
    assert time.perf_counter() - started < 5


@pytest.mark.parametrize("name, content, says", [
    ("binary.yaml", bytes(range(256)) * 4, "not a text file"),
    ("binary.json", b"\xff\xfe\x00{", "not a text file"),
    ("deep.json", b"[" * 100000 + b"]" * 100000, "nested too deeply"),
    ("deep.yaml", b"scales: " + b"[" * 100000 + b"]" * 100000, "nested too deeply"),
    ("deep2.json", b'{"scales": ' + b"[" * 50 + b"]" * 50 + b"}", "nested deeper than"),
    ("huge.yaml", b"lr: 0.1\n" + b"#" * (2 << 20), "larger than"),
    ("long.yaml", b"lr: " + b"x" * 100000, "lr"),
])
def test_hostile_config_files_are_one_line(name, content, says, tmp_path, train_parser):
    path = tmp_path / name
    path.write_bytes(content)
    assert says in _config_error(train_parser, path)


@pytest.fixture
def run_parser():
    from encoding.utils.cli import OneLineParser

    p = OneLineParser(prog="train.py")
    p.add_argument("--config")
    p.add_argument("--crop-size", type=int, default=None)
    p.add_argument("--checkname", default="default")
    p.add_argument("--data-root", default=None)
    p.add_argument("--scales", default=None)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--aux", action="store_true")
    p.add_argument("--trust-code", action="store_true")
    return p


@pytest.mark.parametrize("name, text, key", [
    ("spellings.yaml", "crop-size: 48\ncrop_size: 32\n", "'crop_size' (as 'crop-size' before)"),
    ("same.yaml", "lr: 0.1\naux: true\nlr: 0.2\n", "'lr'"),
    ("spellings.json", '{"crop_size": 48, "crop-size": 32}', "'crop-size' (as 'crop_size' before)"),
    ("same.json", '{"lr": 0.1, "lr": 0.2}', "'lr'"),
])
def test_a_key_given_twice_is_refused_not_last_one_wins(name, text, key, tmp_path, run_parser):
    """A --config file with the same option twice (the same key, or crop-size and crop_size) silently ran the last
    value; refused in one line naming the file and the key, as a recipe's key given twice."""
    path = tmp_path / name
    path.write_text(text)
    assert f"a key given twice: {key}" in _config_error(run_parser, path)


def test_nested_repeats_and_yaml_merges_are_not_top_level_repeats(tmp_path, run_parser):
    from encoding.utils.configfile import read_config

    path = tmp_path / "merge.yaml"
    path.write_text("base: &base {lr: 0.1, aux: true}\nrun:\n  <<: *base\n  lr: 0.2\n")
    assert read_config(str(path))["run"] == {"lr": 0.2, "aux": True}  # YAML's merge override is kept
    path = tmp_path / "nested.json"
    path.write_text('{"lr": 0.2, "x": {"lr": 1}}')
    assert read_config(str(path)) == {"lr": 0.2, "x": {"lr": 1}}


def test_values_starting_with_a_dash_replay_from_the_written_config(tmp_path, run_parser):
    """write_config saved --checkname=-v2 as 'checkname: "-v2"', which replayed as the two tokens --checkname -v2:
    argparse read -v2 as an option ('expected one argument'). Such a value is one --option=value token now."""
    from encoding.utils.configfile import config_argv, expand_config, parse_config, write_config

    run = {"crop_size": 32, "checkname": "-v2", "data_root": "-data", "scales": [-0.5, 1.0], "lr": 0.02,
           "aux": True, "config": None, "trust_code": False}
    path = write_config(str(tmp_path / "config.yaml"),  # as saved_config: not the unrecorded options
                        {k: v for k, v in run.items() if k not in ("config", "trust_code")})
    assert config_argv(run_parser, path) == ["--crop-size", "32", "--checkname=-v2", "--data-root=-data",
                                             "--scales=-0.5,1.0", "--lr", "0.02", "--aux"]
    assert vars(parse_config(run_parser, path)) == {**run, "scales": "-0.5,1.0"}  # the same run back
    args = run_parser.parse_args(expand_config(run_parser, ["--config", path, "--lr", "0.5"]))
    assert (args.checkname, args.data_root, args.lr) == ("-v2", "-data", 0.5)


@pytest.mark.parametrize("key", ["trust-code", "trust_code"])
def test_trust_code_cannot_be_turned_on_in_a_config_file(key, tmp_path, run_parser):
    """'trust-code: true' in a file was accepted (and shown as trust_code=True from the config file) though a file
    cannot opt in for itself; refused as config and traceback are. Off (false / null, the default, as a run's
    written options record it) it still reads."""
    from encoding.utils.configfile import config_argv

    path = tmp_path / "on.yaml"
    path.write_text(f"lr: 0.1\n{key}: true\n")
    message = _config_error(run_parser, path)
    assert f"key '{key}' cannot be set in a file" in message and "--trust-code on the command line" in message
    path.write_text(f"{key}: yes please\n")
    assert "is a switch" in _config_error(run_parser, path)
    for off in ("false", "null"):
        path.write_text(f"lr: 0.1\n{key}: {off}\n")
        assert config_argv(run_parser, str(path)) == ["--lr", "0.1"]
