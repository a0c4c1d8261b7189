"""The command-line parsers of the tools below encoding.config: one table of options each, one builder
(encoding.utils.cli.make_parser / add_arguments), one-line errors with exit status 2."""
import argparse
import pathlib
import re

import pytest

from encoding.utils.cli import Arg, OneLineParser, add_arguments, arg, make_parser

ROOT = pathlib.Path(__file__).resolve().parents[1]
#: Issue 44's acceptance: options are declared as data, not written as calls.
MAX_LITERAL_ADD_ARGUMENT = 15


def _literal_add_argument_calls():
    """``(path, line)`` of every ``add_argument(`` written in encoding/ and experiments/ (as grep counts them)."""
    pattern = re.compile(r"\badd_argument\(")
    return [(str(path.relative_to(ROOT)), number)
            for folder in ("encoding", "experiments") for path in sorted((ROOT / folder).rglob("*.py"))
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if pattern.search(line)]


def test_at_most_15_literal_add_argument_calls():
    calls = _literal_add_argument_calls()
    assert calls, "the count found no add_argument call at all: it is not reading the package"
    assert len(calls) <= MAX_LITERAL_ADD_ARGUMENT, calls


def test_make_parser_turns_a_table_into_a_one_line_parser(capsys):
    table = (arg("root", metavar="DIR", help="a folder"), arg("--seed", type=int, default=1, help="the seed"),
             arg("--fast", action="store_true"))
    parser = make_parser("tool", table, description="A tool.")
    assert isinstance(parser, OneLineParser) and parser.description == "A tool."
    assert vars(parser.parse_args(["d"])) == {"root": "d", "seed": 1, "fast": False}
    assert vars(parser.parse_args(["d", "--seed", "7", "--fast"])) == {"root": "d", "seed": 7, "fast": True}
    assert [a.dest for a in parser._actions] == ["help", "root", "seed", "fast"]  # the table's order
    with pytest.raises(SystemExit) as stop:
        parser.parse_args(["d", "--seed", "x"])
    assert stop.value.code == 2
    assert capsys.readouterr().err == "tool: error: argument --seed: invalid int value: 'x' (see --help)\n"


def test_an_arg_is_frozen_data_and_add_arguments_serves_groups():
    item = arg("--out", default=None)
    assert item == Arg(("--out",), {"default": None})
    with pytest.raises(TypeError):
        item.keywords["default"] = "elsewhere"  # a table entry cannot be changed by one parser
    parser = argparse.ArgumentParser(add_help=False)
    group = parser.add_argument_group("outputs")
    assert add_arguments(group, [item]) is group
    assert parser.parse_args(["--out", "x.png"]).out == "x.png" and group._group_actions[0].dest == "out"


def test_prepare_declares_each_dataset_s_options_once():
    from encoding.datasets.prepare.cli import build_parser
    commands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices
    flags = {name: [s for a in sub._actions for s in a.option_strings if s not in ("-h", "--help")]
             for name, sub in commands.items()}
    fetch, common = ["--download-dir", "--mirror"], ["--checksum", "--overwrite", "--no-progress"]
    assert flags == {"ade20k": ["--root", *fetch, *common, "--with-test"],
                     "pascal": ["--root", *fetch, *common, "--no-voc", "--no-aug"],
                     "pcontext": ["--root", *fetch, *common],
                     "citys": ["--root", *common, "--zips"],
                     "coco": ["--root", *fetch, *common, "--no-masks"],
                     "shapes": ["--root", *common, "--seed", "--num-train", "--num-val"]}
    shapes = commands["shapes"].parse_args(["--seed", "3", "--checksum", "a=b", "--checksum", "c=none"])
    assert (shapes.seed, shapes.checksum, shapes.num_train > 0) == (3, ["a=b", "c=none"], True)
    # the table's default list is shared by every parser made from it: a parse never changes it
    assert commands["shapes"].parse_args([]).checksum == [] and build_parser().parse_args(["citys"]).checksum == []


@pytest.mark.parametrize("argv, message", [
    (["shapes", "--seed", "x"],
     "python -m encoding.datasets.prepare shapes: error: argument --seed: invalid int value: 'x' (see --help)"),
    (["imagenet"], "python -m encoding.datasets.prepare: error: argument NAME: invalid choice: 'imagenet'"),
    (["pcontext", "--bogus"], "python -m encoding.datasets.prepare: error: unrecognized arguments: --bogus"),
])
def test_prepare_refuses_a_bad_option_in_one_line(argv, message, capsys):
    from encoding.datasets.prepare import main
    with pytest.raises(SystemExit) as stop:
        main(argv)
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.startswith(message) and len(err.splitlines()) == 1, err


def test_scan_options_parse_as_before(capsys):
    from encoding.datasets.scan.__main__ import build_parser
    args = build_parser().parse_args(["data"])
    assert vars(args) == {"root": "data", "unknown_labels": "error", "binary": False, "val_fraction": 0.1, "seed": 1,
                          "max_pixels": None, "no_cache": False}
    args = build_parser().parse_args(["data", "--unknown-labels", "ignore", "--binary", "--val-fraction", "0.25",
                                      "--seed", "4", "--max-pixels", "9", "--no-cache"])
    assert (args.unknown_labels, args.binary, args.val_fraction, args.seed, args.max_pixels, args.no_cache) == \
        ("ignore", True, 0.25, 4, 9, True)
    with pytest.raises(SystemExit) as stop:
        build_parser().parse_args(["data", "--val-fraction", "2"])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err == ("python -m encoding.datasets.scan: error: argument --val-fraction: "
                                            "must be in [0, 1], got 2 (see --help)\n")


def test_plot_options_parse_as_before(capsys):
    from encoding.utils.plot import CURVES_NAME, build_parser
    parser = build_parser()
    assert vars(parser.parse_args(["log.csv"])) == {"log": "log.csv", "out": None}
    assert parser.parse_args(["log.csv", "--out", "c.png"]).out == "c.png"
    assert CURVES_NAME in parser.format_help()
    with pytest.raises(SystemExit) as stop:
        parser.parse_args([])
    assert stop.value.code == 2
    assert capsys.readouterr().err.startswith("python -m encoding.utils.plot: error: the following arguments are")


def test_the_config_finder_names_the_script_in_one_line(tmp_path, capsys):
    from encoding.utils.configfile import expand_config
    parser = OneLineParser(prog="train.py")
    parser.add_argument("--crop-size", type=int)
    assert expand_config(parser, ["--crop-size", "3"]) == ["--crop-size", "3"]
    path = tmp_path / "c.yaml"
    path.write_text("crop-size: 5\n")
    assert expand_config(parser, [f"--config={path}", "--crop-size", "3"]) == \
        ["--crop-size", "5", f"--config={path}", "--crop-size", "3"]
    with pytest.raises(SystemExit) as stop:
        expand_config(parser, ["--config"])
    assert stop.value.code == 2
    assert capsys.readouterr().err == "train.py: error: argument --config: expected one argument (see --help)\n"


def test_a_tools_help_names_no_other_scripts_sections():
    """The option groups' summaries are written for train.py / test.py / demo.py: the tools' --help showed "weights:
    Where test.py / demo.py take the weights from" and the page's --max-pixels under "the dataset, its splits"."""
    from encoding.config import build_parser

    for tool in ("memory", "export", "app"):
        titles = [g.title for g in build_parser(tool)._action_groups if g._group_actions]
        own = [t for t in titles if t.startswith(f"{tool}: ")]
        assert len(own) == 1 and not any(".py" in t for t in titles if t not in own), titles
    assert any(g.title.startswith("weights: Where test.py") for g in build_parser("test")._action_groups)
