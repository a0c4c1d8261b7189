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
