"""scripts/prepare_*.py against tiny archives built here (served from a local "mirror" folder, no network)."""
import hashlib
import json
import os
import runpy
import subprocess
import sys
import tarfile
import zipfile

import numpy as np
import pytest

from conftest import same_or_declared_alias
from encoding.datasets import get_segmentation_dataset
from test_datasets import (fake_pycocotools, make_ade, make_aug, make_citys, make_coco, make_context,  # noqa: F401
                           make_voc)

SCRIPTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts")


def script(name):
    return runpy.run_path(os.path.join(SCRIPTS, name), run_name="prepare_under_test")["main"]


def sha256(path):
    with open(path, "rb") as f:
        return "sha256:" + hashlib.sha256(f.read()).hexdigest()


def pack(source_dir, archive, top_levels, kind):
    """Archive ``top_levels`` (folders/files under ``source_dir``) as zip or tar(.gz)."""
    os.makedirs(os.path.dirname(archive), exist_ok=True)
    if kind == "zip":
        with zipfile.ZipFile(archive, "w") as zf:
            for top in top_levels:
                for folder, _, files in os.walk(os.path.join(source_dir, top)):
                    for name in files:
                        path = os.path.join(folder, name)
                        zf.write(path, os.path.relpath(path, source_dir))
    else:
        with tarfile.open(archive, "w:gz" if archive.endswith(("gz", "tgz")) else "w") as tf:
            for top in top_levels:
                tf.add(os.path.join(source_dir, top), arcname=top)
    return archive


def common(tmp_path, *extra):
    return ["--root", str(tmp_path / "data"), "--mirror", str(tmp_path / "mirror"), "--no-progress", *extra]


def test_prepare_ade20k_layout_checksum_error_and_rerun(tmp_path, capsys):
    make_ade(str(tmp_path / "src"))
    archive = pack(str(tmp_path / "src"), str(tmp_path / "mirror" / "ADEChallengeData2016.zip"),
                   ["ADEChallengeData2016"], "zip")
    main = script("prepare_ade20k.py")
    # The real published checksum does not match the tiny archive: clear error, nothing half-written.
    assert main(common(tmp_path)) == 1
    err = capsys.readouterr().err
    assert "checksum mismatch" in err and "ADEChallengeData2016.zip" in err
    assert sorted(os.listdir(tmp_path / "data")) == ["downloads"]
    assert os.listdir(tmp_path / "data" / "downloads") == []
    # With the right checksum the layout is produced and the dataset loads.
    args = common(tmp_path, "--checksum", f"ADEChallengeData2016.zip={sha256(archive)}")
    assert main(args) == 0
    assert "ready:" in capsys.readouterr().out
    ds = get_segmentation_dataset("ade20k", root=str(tmp_path / "data"), split="val", mode="testval")
    assert len(ds) == 2 and int(ds[0][1].max()) == 149
    # Re-running neither downloads nor extracts again (the mirror may vanish; local edits survive).
    marker = tmp_path / "data" / "ADEChallengeData2016" / "images" / "training" / "note.txt"
    marker.write_text("kept")
    os.remove(archive)
    assert main(args) == 0 and marker.read_text() == "kept"


def test_prepare_pascal_voc_and_aug(tmp_path):
    make_voc(str(tmp_path / "src"))
    make_aug(str(tmp_path / "src" / "sbd"))
    os.rename(tmp_path / "src" / "sbd" / "VOCaug", tmp_path / "src" / "sbd" / "benchmark_RELEASE")
    voc = pack(str(tmp_path / "src"), str(tmp_path / "mirror" / "VOCtrainval_11-May-2012.tar"), ["VOCdevkit"], "tar")
    sbd = pack(str(tmp_path / "src" / "sbd"), str(tmp_path / "mirror" / "benchmark.tgz"), ["benchmark_RELEASE"],
               "tar")
    main = script("prepare_pascal.py")
    assert main(common(tmp_path, "--checksum", f"VOCtrainval_11-May-2012.tar={sha256(voc)}",
                       "--checksum", f"benchmark.tgz={sha256(sbd)}")) == 0
    root = str(tmp_path / "data")
    assert len(get_segmentation_dataset("pascal_voc", root=root, split="train")) == 3
    # the .mat labels were converted at prepare time: loading only reads PNGs
    pngs = os.path.join(root, "VOCaug", "dataset", "cls_png")
    assert sorted(os.listdir(pngs)) == ["2008_000000.png", "2008_000001.png"]
    aug = get_segmentation_dataset("pascal_aug", root=root, split="trainval", mode="testval")
    assert len(aug) == 2  # train + val, de-duplicated
    with open(os.path.join(root, "VOCaug", "dataset", "trainval.txt")) as f:
        assert f.read().split() == ["2008_000000", "2008_000001"]


def test_prepare_pcontext_converts_annotations(tmp_path):
    voc_root, json_path, expected = make_context(str(tmp_path / "src"))
    tar = pack(str(tmp_path / "src"), str(tmp_path / "mirror" / "VOCtrainval_03-May-2010.tar"), ["VOCdevkit"],
               "tar")
    os.replace(json_path, tmp_path / "mirror" / "trainval_merged.json")
    main = script("prepare_pcontext.py")
    assert main(common(tmp_path, "--checksum", f"VOCtrainval_03-May-2010.tar={sha256(tar)}",
                       "--checksum", "trainval_merged.json=none")) == 0
    ds = get_segmentation_dataset("pcontext", root=str(tmp_path / "data"), split="val", mode="testval")
    assert len(ds) == 1
    assert np.array_equal(ds[0][1].numpy(), expected["2008_000001"])


def test_prepare_citys_instructions_and_extraction(tmp_path, capsys):
    main = script("prepare_citys.py")
    assert main(["--root", str(tmp_path / "data")]) == 2
    assert "cityscapes-dataset.com" in capsys.readouterr().out
    make_citys(str(tmp_path / "src"), "train")
    make_citys(str(tmp_path / "src"), "val", cities=("bremen",))
    src = str(tmp_path / "src" / "citys")
    pack(src, str(tmp_path / "zips" / "gtFine_trainvaltest.zip"), ["gtFine"], "zip")
    pack(src, str(tmp_path / "zips" / "leftImg8bit_trainvaltest.zip"), ["leftImg8bit"], "zip")
    assert main(["--root", str(tmp_path / "data"), "--zips", str(tmp_path / "zips"), "--no-progress",
                 "--checksum", "gtFine_trainvaltest.zip=md5:" + "0" * 32]) == 1
    assert "checksum mismatch" in capsys.readouterr().err
    assert not (tmp_path / "data" / "citys").exists()
    assert main(["--root", str(tmp_path / "data"), "--zips", str(tmp_path / "zips"), "--no-progress"]) == 0
    assert len(get_segmentation_dataset("citys", root=str(tmp_path / "data"), split="train")) == 2
    assert len(get_segmentation_dataset("citys", root=str(tmp_path / "data"), split="val")) == 1


def test_prepare_coco_builds_masks(tmp_path, fake_pycocotools):  # noqa: F811 - pytest fixture
    base = make_coco(str(tmp_path / "src"), "val")
    make_coco(str(tmp_path / "src"), "train")
    sums = []
    for name, top in (("annotations_trainval2017.zip", "annotations"), ("val2017.zip", "val2017"),
                      ("train2017.zip", "train2017")):
        archive = pack(base, str(tmp_path / "mirror" / name), [top], "zip")
        sums += ["--checksum", f"{name}={sha256(archive)}"]
    assert script("prepare_coco.py")(common(tmp_path, *sums)) == 0
    coco = os.path.join(str(tmp_path / "data"), "coco")
    with open(os.path.join(coco, "masks_voc", "val2017.txt")) as f:
        assert f.read().split() == ["000000000001"]
    assert len(get_segmentation_dataset("coco", root=str(tmp_path / "data"), split="train")) == 1


def test_prepare_shapes_script(tmp_path):
    main = script("prepare_shapes.py")
    assert main(["--root", str(tmp_path), "--num-train", "3", "--num-val", "2", "--no-progress"]) == 0
    with open(tmp_path / "shapes-seed0-3-2" / "shapes.json") as f:
        assert json.load(f)["num_train"] == 3


def test_prepare_module_cli_names_and_errors(tmp_path, capsys):
    from encoding.datasets import prepare

    assert set(prepare.PREPARERS) == {"ade20k", "pascal", "pcontext", "citys", "coco", "shapes"}
    assert prepare.main(["shapes", "--root", str(tmp_path), "--num-train", "2", "--num-val", "1",
                         "--no-progress"]) == 0
    assert "ready:" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        prepare.main(["imagenet"])
    assert "invalid choice" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="NAME=DIGEST"):
        prepare.main(["pcontext", "--root", str(tmp_path), "--checksum", "oops"])
    assert prepare.main(["ade20k", "--root", str(tmp_path / "data"), "--mirror", str(tmp_path / "none"),
                         "--no-progress"]) == 1
    assert capsys.readouterr().err.startswith("error: ")


def test_prepare_module_runs_as_a_command(tmp_path):
    result = subprocess.run([sys.executable, "-m", "encoding.datasets.prepare", "shapes", "--root", str(tmp_path),
                             "--num-train", "2", "--num-val", "1", "--no-progress"], capture_output=True, text=True,
                            check=False)
    assert result.returncode == 0, result.stderr
    assert os.path.isfile(tmp_path / "shapes-seed0-2-1" / "shapes.json")


def test_run_recipe_extracts_checks_the_layout_and_converts(tmp_path):
    from encoding.datasets import DatasetError
    from encoding.datasets.prepare import Recipe, run_recipe
    from encoding.datasets.prepare import Resource

    (tmp_path / "src" / "thing" / "images").mkdir(parents=True)
    (tmp_path / "src" / "thing" / "images" / "a.txt").write_text("a")
    pack(str(tmp_path / "src"), str(tmp_path / "mirror" / "thing.zip"), ["thing"], "zip")
    (tmp_path / "mirror" / "notes.json").write_text("{}")
    calls = []
    recipe = Recipe("thing", (Resource("https://example.invalid/thing.zip"),), ("images",),
                    files=(Resource("https://example.invalid/notes.json"),),
                    convert=lambda *args: calls.append(args))
    options = dict(mirror=str(tmp_path / "mirror"), progress=False)
    root = str(tmp_path / "data")
    folder = run_recipe(recipe, root, **options)
    assert folder == os.path.join(root, "thing") and os.path.isfile(os.path.join(folder, "images", "a.txt"))
    # The converter gets the dataset folder and the fetched, not extracted, files (kept in <root>/downloads).
    assert calls == [(folder, [os.path.join(root, "downloads", "notes.json")], False, False)]
    # A layout the archive does not hold is an error naming the missing path, before any conversion.
    with pytest.raises(DatasetError, match=r"thing.labels.*missing after extraction"):
        run_recipe(recipe._replace(expected=("images", "labels")), root, **options)
    assert len(calls) == 1


#: Dataset module -> {name it had: name in encoding.datasets.prepare} of what moved to preparation.
MOVED = {
    "encoding.datasets.ade20k": {"prepare_ade20k": "prepare_ade20k", "RESOURCES": "ADE20K_RESOURCES"},
    "encoding.datasets.pascal_voc": {"prepare_pascal": "prepare_pascal", "RESOURCES": "VOC_RESOURCES"},
    "encoding.datasets.pcontext": {"prepare_pcontext": "prepare_pcontext", "RESOURCES": "CONTEXT_RESOURCES",
                                   "decode_rle": "decode_rle",
                                   "convert_context_annotations": "convert_context_annotations"},
    "encoding.datasets.cityscapes": {"prepare_citys": "prepare_citys", "PACKAGES": "CITYS_PACKAGES",
                                     "INSTRUCTIONS": "CITYS_INSTRUCTIONS"},
    "encoding.datasets.coco": {"prepare_coco": "prepare_coco", "RESOURCES": "COCO_RESOURCES"},
    "encoding.datasets.shapes": {"prepare_shapes": "prepare_shapes"},
}


def test_moved_names_still_resolve_from_the_dataset_modules():
    import importlib

    from encoding.datasets import prepare
    from encoding.datasets.pcontext import convert_context_annotations  # the spelling tests/users import

    assert same_or_declared_alias(convert_context_annotations, prepare.convert_context_annotations)
    for module_name, names in MOVED.items():
        module = importlib.import_module(module_name)
        for old, new in names.items():
            assert same_or_declared_alias(getattr(module, old), getattr(prepare, new)), (module_name, old)
            assert old not in module.__all__  # the dataset modules only load data
        with pytest.raises(AttributeError, match="has no attribute 'missing'"):
            getattr(module, "missing")


def test_each_dataset_command_says_where_it_writes(tmp_path, capsys, monkeypatch):
    """The first write under a data folder says where (once), and where the root came from: the --root given,
    ENCODING_DATA, or the default ~/.encoding/data."""
    from encoding.datasets import prepare
    from encoding.datasets.prepare import location

    make_ade(str(tmp_path / "src"))
    archive = pack(str(tmp_path / "src"), str(tmp_path / "mirror" / "ADEChallengeData2016.zip"),
                   ["ADEChallengeData2016"], "zip")
    args = common(tmp_path, "--checksum", f"ADEChallengeData2016.zip={sha256(archive)}")
    assert prepare.main(["ade20k", *args]) == 0
    out = capsys.readouterr().out.splitlines()
    folder = tmp_path / "data" / "ADEChallengeData2016"
    assert out[0] == f"data: writing the prepared dataset to {folder} (the data root given)", out
    assert sum(line.startswith("data: ") for line in out) == 1  # downloads, extraction, check: said once
    monkeypatch.setenv("ENCODING_DATA", str(tmp_path / "env"))
    assert prepare.main(["shapes", "--num-train", "2", "--num-val", "1", "--no-progress"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == (f"data: writing the generated shapes dataset to "
                                                       f"{tmp_path / 'env' / 'shapes-seed0-2-1'} (the data root, "
                                                       "from ENCODING_DATA)")
    monkeypatch.delenv("ENCODING_DATA")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert location.root_origin(os.path.expanduser("~/.encoding/data")) == (
        "the default data root ~/.encoding/data; set ENCODING_DATA to choose another")
