"""Dataset preparation refuses what would write outside the data root, delete a user's data or corrupt labels, and
says so in one line: JSON file names, archive kind clashes, tar links without the data filter, bad options, bad
annotation / label files, re-runs after a dataset folder was removed, symlinked dataset folders, HTTP 416 and 4xx.
Everything is built here and served from local files or a local HTTP server (no network)."""
import io
import json
import os
import shutil
import sys
import tarfile
import zipfile

import numpy as np
import pytest

from encoding.datasets import DatasetError
from encoding.datasets import prepare
from encoding.datasets.prepare import RECIPES, install
from encoding.datasets.prepare.coco_masks import build_coco_masks
from encoding.datasets.prepare.download import DownloadError, download, extract
from encoding.datasets.prepare.pcontext_json import convert_context_annotations
import test_datasets
from payload_server import serve_payload


#: pycocotools' COCO replaced by test_datasets' small stand-in (a pytest fixture).
fake_pycocotools = test_datasets.fake_pycocotools


def _tar(path, members):
    """A tar of ``(name, type, linkname, data)`` members."""
    os.makedirs(os.path.dirname(str(path)), exist_ok=True)
    with tarfile.open(path, "w") as tf:
        for name, kind, linkname, data in members:
            info = tarfile.TarInfo(name)
            info.type, info.linkname, info.size = kind, linkname, len(data)
            tf.addfile(info, io.BytesIO(data) if data else None)
    return str(path)


def _file(name, data=b"x"):
    return name, tarfile.REGTYPE, "", data


def _zip(path, files):
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)
    return str(path)


def _every_file(folder):
    return sorted(os.path.relpath(os.path.join(d, n), folder) for d, _, names in os.walk(folder) for n in names)


# ------------------------------------------------------------------------------------ 1. JSON file names as paths
def _context_json(path, file_name, **image):
    record = {"image_id": 1, "file_name": file_name, "height": 2, "width": 2, "phase": "val", **image}
    with open(path, "w") as f:
        json.dump({"images": [record], "annos_segmentation": []}, f)
    return str(path)


@pytest.mark.parametrize("file_name", ["../../../ESCAPED.jpg", "/tmp/ABSOLUTE.jpg", "sub/dir.jpg", "..", ""])
def test_pcontext_refuses_a_file_name_that_is_not_a_plain_name(tmp_path, file_name):
    voc = tmp_path / "root" / "VOCdevkit" / "VOC2010"
    voc.mkdir(parents=True)
    json_path = _context_json(tmp_path / "trainval_merged.json", file_name)
    with pytest.raises(DatasetError, match="trainval_merged.json: image file_name .* is not a plain file name") as e:
        convert_context_annotations(json_path, str(voc), progress=False)
    assert repr(file_name) in str(e.value)
    assert _every_file(tmp_path) == ["trainval_merged.json"]  # no mask anywhere, no list file


def test_coco_refuses_a_file_name_that_is_not_a_plain_name(tmp_path, fake_pycocotools):
    coco = tmp_path / "root" / "coco"
    (coco / "annotations").mkdir(parents=True)
    image = {"id": 1, "file_name": "../../../ESCAPED.jpg", "height": 40, "width": 40}
    ann = {"id": 1, "image_id": 1, "category_id": 1, "iscrowd": 0, "segmentation": [[0, 0, 40, 0, 40, 40, 0, 40]]}
    (coco / "annotations" / "instances_val2017.json").write_text(json.dumps({"images": [image],
                                                                            "annotations": [ann]}))
    with pytest.raises(DatasetError, match=r"instances_val2017.json: image file_name '\.\./\.\./\.\./ESCAPED.jpg'"):
        build_coco_masks(str(coco), "val", progress=False)
    assert _every_file(tmp_path) == ["root/coco/annotations/instances_val2017.json"]


# --------------------------------------------------------------------------------- 2. merging never deletes data
def test_an_archive_file_never_replaces_an_existing_folder(tmp_path):
    root = tmp_path / "root"
    (root / "VOCdevkit" / "VOC2012").mkdir(parents=True)
    (root / "VOCdevkit" / "VOC2012" / "a.jpg").write_bytes(b"user data")
    archive = _zip(tmp_path / "ade.zip", {"ADE/x.txt": b"x", "VOCdevkit": b"a file"})
    with pytest.raises(DatasetError, match=r"ade.zip: entry 'VOCdevkit' is a file but .*VOCdevkit is an existing "
                                           r"folder; refusing"):
        extract(archive, str(root), progress=False)
    assert (root / "VOCdevkit" / "VOC2012" / "a.jpg").read_bytes() == b"user data"
    assert sorted(os.listdir(root)) == ["VOCdevkit"]  # checked before anything moved: ADE/ is not placed either


def test_an_archive_folder_never_replaces_an_existing_file(tmp_path):
    root = tmp_path / "root"
    (root / "ds").mkdir(parents=True)
    (root / "ds" / "notes").write_text("mine")
    archive = _tar(tmp_path / "a.tar", [_file("ds/notes/inner.txt")])
    with pytest.raises(DatasetError, match=r"entry 'ds/notes' is a folder but .*notes is an existing file"):
        extract(archive, str(root), progress=False)
    assert (root / "ds" / "notes").read_text() == "mine"


# ------------------------------------------------------------------- 3. tar without the data filter: no links at all
UNSAFE_WITHOUT_FILTER = {
    "symlink chain": [("ds/l", tarfile.SYMTYPE, "..", b""), ("ds/l/m", tarfile.SYMTYPE, "..", b""),
                      ("ds/l/m/n", tarfile.SYMTYPE, "..", b""), _file("ds/l/m/n/ESCAPED.txt")],
    "hard link": [_file("ds/a.txt"), ("ds/h", tarfile.LNKTYPE, "ds/a.txt", b"")],
    "device": [("ds/null", tarfile.CHRTYPE, "", b"")],
    "fifo": [("ds/pipe", tarfile.FIFOTYPE, "", b"")],
}


@pytest.mark.parametrize("case", sorted(UNSAFE_WITHOUT_FILTER))
def test_a_python_without_the_tar_filter_refuses_links_and_special_files(tmp_path, monkeypatch, case):
    monkeypatch.delattr(tarfile, "data_filter", raising=False)
    archive = _tar(tmp_path / "evil.tar", UNSAFE_WITHOUT_FILTER[case])
    dest = tmp_path / "data" / "root"
    with pytest.raises(DatasetError, match=r"evil.tar: unsafe member 'ds/\w+' \(a .*no extraction filter"):
        extract(archive, str(dest), progress=False)
    assert _every_file(tmp_path) == ["evil.tar"]


def test_a_python_without_the_tar_filter_still_extracts_files_and_folders(tmp_path, monkeypatch):
    monkeypatch.delattr(tarfile, "data_filter", raising=False)
    extract(_tar(tmp_path / "ok.tar", [_file("ds/sub/a.txt", b"a")]), str(tmp_path / "data"), progress=False)
    assert (tmp_path / "data" / "ds" / "sub" / "a.txt").read_bytes() == b"a"


# ------------------------------------------------------------------------------------ 4. one-line errors, not bugs
def test_a_member_the_tar_filter_refuses_is_named_unsafe_not_corrupt(tmp_path):
    if not hasattr(tarfile, "data_filter"):
        pytest.skip("this Python's tarfile has no data filter (the fallback is tested above)")
    archive = _tar(tmp_path / "dev.tar", [("ds/null", tarfile.CHRTYPE, "", b"")])
    with pytest.raises(DatasetError, match=r"dev.tar: unsafe member 'ds/null' \(") as e:
        extract(archive, str(tmp_path / "data"), progress=False)
    assert "corrupt" not in str(e.value)


def _mirror_ade(tmp_path, data):
    (tmp_path / "mirror").mkdir(exist_ok=True)
    (tmp_path / "mirror" / "ADEChallengeData2016.zip").write_bytes(data)
    return ["ade20k", "--root", str(tmp_path / "data"), "--mirror", str(tmp_path / "mirror"), "--no-progress"]


def test_a_truncated_archive_is_one_line_naming_it(tmp_path, capsys):
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tf:
        for i in range(3):
            data = os.urandom(50000)
            info = tarfile.TarInfo(f"ADEChallengeData2016/images/training/{i}.bin")
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    args = _mirror_ade(tmp_path, buffer.getvalue()[:60000])
    assert prepare.main([*args, "--checksum", "ADEChallengeData2016.zip=none"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1
    assert "ADEChallengeData2016.zip: corrupt or truncated archive" in err


def test_a_malformed_checksum_digest_is_one_line_naming_the_argument(tmp_path):
    args = _mirror_ade(tmp_path, b"whatever")
    with pytest.raises(SystemExit, match=r"--checksum 'ADEChallengeData2016.zip=abc': cannot tell the hash"):
        prepare.main([*args, "--checksum", "ADEChallengeData2016.zip=abc"])
    assert not (tmp_path / "data").exists()  # refused before any work


def test_a_corrupt_coco_json_is_a_dataset_error(tmp_path, fake_pycocotools):
    (tmp_path / "coco" / "annotations").mkdir(parents=True)
    (tmp_path / "coco" / "annotations" / "instances_val2017.json").write_text('{"images": [')
    with pytest.raises(DatasetError, match="instances_val2017.json: not a COCO instances annotation file"):
        build_coco_masks(str(tmp_path / "coco"), "val", progress=False)


@pytest.mark.parametrize("size", [{"height": 10 ** 7, "width": 10 ** 7}, {"height": -2}, {"width": "2"}])
def test_an_image_size_from_json_is_checked_before_allocating(tmp_path, size):
    voc = tmp_path / "VOC2010"
    voc.mkdir()
    json_path = _context_json(tmp_path / "context.json", "a.jpg", **size)
    with pytest.raises(DatasetError, match=r"context.json: image 'a.jpg': .*(over the limit|positive whole number)"):
        convert_context_annotations(json_path, str(voc), progress=False)


def test_an_image_size_from_coco_json_is_checked_before_allocating(tmp_path, fake_pycocotools):
    (tmp_path / "coco" / "annotations").mkdir(parents=True)
    image = {"id": 1, "file_name": "a.jpg", "height": 10 ** 6, "width": 10 ** 6}
    (tmp_path / "coco" / "annotations" / "instances_val2017.json").write_text(
        json.dumps({"images": [image], "annotations": []}))
    with pytest.raises(DatasetError, match=r"instances_val2017.json: image 'a.jpg': .* over the limit"):
        build_coco_masks(str(tmp_path / "coco"), "val", progress=False)


def _savemat(path, segmentation, **options):
    scipy_io = pytest.importorskip("scipy.io")
    scipy_io.savemat(str(path), {"GTcls": {"Segmentation": segmentation}}, **options)
    return str(path)


def test_a_truncated_or_foreign_mat_file_is_a_dataset_error(tmp_path):
    from encoding.datasets.prepare.sbd import read_sbd_segmentation

    whole = _savemat(tmp_path / "ok.mat", np.zeros((5, 5), np.uint8), do_compression=True)
    (tmp_path / "trunc.mat").write_bytes(open(whole, "rb").read()[:100])
    with pytest.raises(DatasetError, match="trunc.mat: cannot read .mat label"):
        read_sbd_segmentation(str(tmp_path / "trunc.mat"))
    with pytest.raises(DatasetError, match="text.mat: GTcls.Segmentation is not a 2-D array of numbers"):
        read_sbd_segmentation(_savemat(tmp_path / "text.mat", "abc"))


# -------------------------------------------------------------------------------------- 5. silent label corruption
@pytest.mark.parametrize("value", [300, -1, 2.7, 21])
def test_sbd_label_values_outside_the_classes_are_refused(tmp_path, value):
    from encoding.datasets.prepare.sbd import read_sbd_segmentation

    path = _savemat(tmp_path / "bad.mat", np.array([[0, 255], [20, value]]))
    with pytest.raises(DatasetError, match=r"bad.mat: label values must be whole numbers in 0..20 or 255"):
        read_sbd_segmentation(path)
    good = read_sbd_segmentation(_savemat(tmp_path / "good.mat", np.array([[0, 255], [20, 3.0]])))
    assert good.dtype == np.uint8 and good.tolist() == [[0, 255], [20, 3]]


def test_a_negative_context_category_id_is_refused(tmp_path):
    pytest.importorskip("pycocotools")
    voc = tmp_path / "VOC2010"
    voc.mkdir()
    record = {"image_id": 1, "file_name": "b.jpg", "height": 2, "width": 2, "phase": "train"}
    ann = {"id": 7, "image_id": 1, "category_id": -1, "segmentation": {"size": [2, 2], "counts": [0, 4]}}
    (tmp_path / "neg.json").write_text(json.dumps({"images": [record], "annos_segmentation": [ann]}))
    with pytest.raises(DatasetError, match=r"neg.json: bad annotation for b.jpg: annotation 7 has category_id -1"):
        convert_context_annotations(str(tmp_path / "neg.json"), str(voc), progress=False)
    assert not (voc / "SegmentationClassContext").exists()


# -------------------------------------------------------------------------------- 6. options accepted and ignored
def test_a_checksum_for_a_file_the_dataset_does_not_have_is_refused(tmp_path):
    args = _mirror_ade(tmp_path, b"whatever")
    with pytest.raises(SystemExit, match=r"--checksum 'ADEChallengeData2016.ZIP=none': 'ADEChallengeData2016.ZIP' is "
                                         r"not one of the dataset's files \(ADEChallengeData2016.zip, release_test"):
        prepare.main([*args, "--checksum", "ADEChallengeData2016.ZIP=none"])
    assert not (tmp_path / "data").exists()


def test_shapes_refuses_a_checksum_it_would_ignore(tmp_path):
    with pytest.raises(SystemExit, match=r"--checksum 'a=md5:0+': this dataset has no file to verify"):
        prepare.main(["shapes", "--root", str(tmp_path), "--no-progress", "--checksum", "a=md5:" + "0" * 32])
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("argv, says", [
    (["--num-train", "-3"], "argument --num-train: must be > 0, got -3"),
    (["--num-val", "0"], "argument --num-val: must be > 0, got 0"),
    (["--seed", "-1"], "argument --seed: must be >= 0, got -1"),
])
def test_shapes_refuses_options_it_cannot_honour(tmp_path, capsys, argv, says):
    with pytest.raises(SystemExit) as e:
        prepare.main(["shapes", "--root", str(tmp_path), "--no-progress", *argv])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert says in err and err.count("\n") == 1
    assert os.listdir(tmp_path) == []


def test_pascal_without_voc_and_without_aug_is_refused(tmp_path, capsys):
    assert prepare.main(["pascal", "--root", str(tmp_path), "--no-voc", "--no-aug", "--no-progress"]) == 2
    assert "nothing to prepare" in capsys.readouterr().err
    with pytest.raises(ValueError, match="--no-voc --no-aug"):
        prepare.prepare_pascal(str(tmp_path), voc=False, aug=False)


# ------------------------------------------------------------- 7. a dataset folder removed under a shared top level
def test_a_removed_dataset_sharing_a_top_level_folder_is_extracted_again(tmp_path):
    voc2012 = _tar(tmp_path / "VOCtrainval_11-May-2012.tar",
                   [_file("VOCdevkit/VOC2012/ImageSets/Segmentation/train.txt", b"a\n")])
    voc2010 = _tar(tmp_path / "VOCtrainval_03-May-2010.tar", [_file("VOCdevkit/VOC2010/JPEGImages/a.jpg", b"j")])
    root = str(tmp_path / "root")
    context = RECIPES["pcontext"]._replace(convert=None)
    install(RECIPES["pascal_voc"], root, [voc2012], progress=False)
    install(context, root, [voc2010], progress=False)
    shutil.rmtree(os.path.join(root, "VOCdevkit", "VOC2010"))  # VOCdevkit/ (the archive's top level) remains
    install(context, root, [voc2010], progress=False)
    assert open(os.path.join(root, "VOCdevkit", "VOC2010", "JPEGImages", "a.jpg"), "rb").read() == b"j"
    assert os.path.isfile(os.path.join(root, "VOCdevkit", "VOC2012", "ImageSets", "Segmentation", "train.txt"))


# ------------------------------------------------------------------------------ 8. a dataset folder that is a link
def test_a_symlinked_dataset_folder_is_merged_into_its_target(tmp_path):
    root, disk = tmp_path / "root", tmp_path / "bigdisk"
    (disk / "VOCdevkit" / "VOC2012").mkdir(parents=True)
    root.mkdir()
    os.symlink(disk / "VOCdevkit", root / "VOCdevkit")
    archive = _tar(tmp_path / "voc2010.tar", [_file("VOCdevkit/VOC2010/JPEGImages/a.jpg", b"j")])
    extract(archive, str(root), progress=False)
    assert os.path.islink(root / "VOCdevkit")
    assert (disk / "VOCdevkit" / "VOC2010" / "JPEGImages" / "a.jpg").read_bytes() == b"j"
    assert (disk / "VOCdevkit" / "VOC2012").is_dir()


# ------------------------------------------------------------------------------------------- 9, 10. HTTP answers
PAYLOAD = b"REAL-CONTENT" * 10


@pytest.fixture()
def server():
    with serve_payload("/data.zip", PAYLOAD) as served:
        yield served


@pytest.mark.parametrize("stale", [b"STALE-GARBAGE" * 30, b"X" * len(PAYLOAD)], ids=["larger", "same-size"])
def test_a_416_answer_keeps_a_partial_file_only_of_the_remote_size(tmp_path, server, stale):
    dest = tmp_path / "data.zip"
    (tmp_path / "data.zip.part").write_bytes(stale)
    download(server.url + "/data.zip", str(dest), progress=False, retries=1)
    expected = stale if len(stale) == len(PAYLOAD) else PAYLOAD  # the right size: complete, as resumed downloads
    assert dest.read_bytes() == expected and not (tmp_path / "data.zip.part").exists()


def test_permanent_http_errors_are_not_retried(tmp_path, server, monkeypatch):
    fetching = sys.modules["encoding.datasets.prepare.download"]  # the package's `download` is the function
    monkeypatch.setattr(fetching.time, "sleep", lambda seconds: None)
    with pytest.raises(DownloadError, match="404"):
        download(server.url + "/404", str(tmp_path / "a.zip"), progress=False, retries=3)
    assert len(server.hits) == 1
    for code in (503, 429, 408):  # transient: retried
        server.hits.clear()
        with pytest.raises(DownloadError, match=f"after 3 attempt.*{code}"):
            download(server.url + f"/{code}", str(tmp_path / "a.zip"), progress=False, retries=3)
        assert len(server.hits) == 3, code
