"""The embedded ``shapes`` dataset: scene generator, atomic/idempotent generation, and loading through the dataset."""
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch
from PIL import Image

import encoding.datasets.prepare.shapes_render as shapes  # the generator (prepare step); the dataset only loads
from encoding.datasets import DatasetError, ShapesSegmentation, get_segmentation_dataset, pad_collate


def _scenes(seed, n, split="train"):
    return [shapes._scene_for(seed, split, i) for i in range(n)]


def test_scenes_are_deterministic_per_seed_and_index():
    a, b = _scenes(3, 3), _scenes(3, 3)
    for (ia, la), (ib, lb) in zip(a, b):
        assert np.array_equal(ia, ib) and np.array_equal(la, lb)
    other = _scenes(4, 3)
    assert not any(np.array_equal(la, lo) for (_, la), (_, lo) in zip(a, other))
    # each image has its own stream: generating image 2 alone gives the same scene
    image, label = shapes._scene_for(3, "train", 2)
    assert np.array_equal(image, a[2][0]) and np.array_equal(label, a[2][1])


def test_scenes_have_all_classes_sizes_and_thin_ignore_boundaries():
    scenes = _scenes(0, 40)
    seen = set()
    for image, label in scenes:
        h, w = label.shape
        assert image.shape == (h, w, 3) and image.dtype == np.uint8 and label.dtype == np.uint8
        assert shapes.SIDE_RANGE[0] <= h <= shapes.SIDE_RANGE[1] and shapes.SIDE_RANGE[0] <= w <= shapes.SIDE_RANGE[1]
        values = set(np.unique(label).tolist())
        assert values <= set(range(7)) | {255}
        seen |= values
        # every boundary between two labels is covered by ignore: 4-neighbours never hold two different classes
        for a, b in ((label[1:, :], label[:-1, :]), (label[:, 1:], label[:, :-1])):
            both = (a != 255) & (b != 255)
            assert np.all(a[both] == b[both])
        ignore = label == 255
        assert ignore.mean() < 0.15  # thin band, not a mask of its own
    assert seen == set(range(7)) | {255}
    sizes = {label.shape for _, label in scenes}
    assert len(sizes) > 10  # varied image sizes (exercises the padding collate)


def test_object_colour_does_not_give_away_the_class():
    """Colours are drawn independently of the class: per-class mean colours are close to one another."""
    sums, counts = np.zeros((7, 3)), np.zeros(7)
    for image, label in _scenes(1, 60):
        for cls in range(1, 7):
            inside = label == cls
            if inside.any():
                sums[cls] += image[inside].mean(0)
                counts[cls] += 1
    means = sums[1:] / counts[1:, None]
    assert counts[1:].min() >= 15
    spread = np.abs(means[:, None, :] - means[None, :, :]).max()
    assert spread < 45, means


def test_generation_layout_marker_and_idempotence(tmp_path):
    folder = shapes.ensure_shapes(str(tmp_path), seed=5, num_train=6, num_val=3, progress=False)
    assert folder == str(tmp_path / "shapes-seed5-6-3")
    for split, n in (("train", 6), ("val", 3), ("trainval", 9)):
        with open(os.path.join(folder, "ImageSets", split + ".txt")) as f:
            assert len(f.read().split()) == n
    assert len(os.listdir(os.path.join(folder, "JPEGImages"))) == 9
    assert len(os.listdir(os.path.join(folder, "SegmentationClass"))) == 9
    with open(os.path.join(folder, shapes.MARKER)) as f:
        marker = json.load(f)
    assert marker["generator_version"] == shapes.GENERATOR_VERSION and marker["seed"] == 5
    stamp = os.stat(os.path.join(folder, "JPEGImages", "train_00000.jpg")).st_mtime_ns
    assert shapes.ensure_shapes(str(tmp_path), seed=5, num_train=6, num_val=3, progress=False) == folder
    assert os.stat(os.path.join(folder, "JPEGImages", "train_00000.jpg")).st_mtime_ns == stamp  # not regenerated
    # A stale marker (older generator) triggers a regeneration.
    marker["generator_version"] = -1
    with open(os.path.join(folder, shapes.MARKER), "w") as f:
        json.dump(marker, f)
    shapes.ensure_shapes(str(tmp_path), seed=5, num_train=6, num_val=3, progress=False)
    with open(os.path.join(folder, shapes.MARKER)) as f:
        assert json.load(f)["generator_version"] == shapes.GENERATOR_VERSION
    assert sorted(os.listdir(tmp_path)) == [".shapes-seed5-6-3.lock", "shapes-seed5-6-3"]  # no staging / old folder


def test_generation_in_several_processes_writes_the_same_files(tmp_path):
    """Every scene has its own random stream: two worker processes write byte-identical files and lists."""
    folders = [shapes.generate_shapes(str(tmp_path / f"w{n}"), seed=3, num_train=7, num_val=3, progress=False,
                                      workers=n) for n in (1, 2)]
    trees = []
    for folder in folders:
        files = sorted(os.path.relpath(os.path.join(d, f), folder) for d, _, fs in os.walk(folder) for f in fs)
        trees.append({name: open(os.path.join(folder, name), "rb").read() for name in files})
    assert len(trees[0]) == 10 + 10 + 3 + 1 and trees[0] == trees[1]


def test_interrupted_generation_leaves_no_dataset(tmp_path, monkeypatch):
    real = shapes._scene_for
    calls = []

    def dying(seed, split, index):
        calls.append(index)
        if len(calls) == 4:
            raise KeyboardInterrupt("killed")
        return real(seed, split, index)

    monkeypatch.setattr(shapes, "_scene_for", dying)
    with pytest.raises(KeyboardInterrupt):
        ShapesSegmentation(str(tmp_path), split="train", num_train=6, num_val=2, progress=False)
    assert os.listdir(tmp_path) == [".shapes-seed0-6-2.lock"]  # the (released) lock file only
    monkeypatch.setattr(shapes, "_scene_for", real)
    ds = ShapesSegmentation(str(tmp_path), split="train", num_train=6, num_val=2, progress=False)
    assert len(ds) == 6


def test_dataset_reads_generated_files_in_every_mode(tmp_path):
    kw = dict(root=str(tmp_path), num_train=8, num_val=4, progress=False)
    train = get_segmentation_dataset("shapes", split="train", **kw)
    assert (train.base_size, train.crop_size) == (ShapesSegmentation.BASE_SIZE, ShapesSegmentation.CROP_SIZE)
    torch.manual_seed(0)
    image, mask = train[0]
    assert image.shape == (3, 128, 128) and mask.dtype == torch.int64
    assert int(mask.min()) >= -1 and int(mask.max()) <= 6
    val = get_segmentation_dataset("shapes", split="val", mode="testval", return_name=True, **kw)
    image, mask, name = val[1]
    raw = np.array(Image.open(os.path.join(val.dataset_dir, "SegmentationClass", "val_00001.png")))
    assert name == "val_00001.jpg"
    assert torch.equal(mask, torch.from_numpy(np.where(raw == 255, -1, raw.astype(np.int64))))
    images, masks, names = pad_collate([val[i] for i in range(4)])
    assert images.shape[0] == 4 and list(names) == [f"val_{i:05d}.jpg" for i in range(4)]
    with pytest.raises(DatasetError, match="shapes dataset not found"):
        ShapesSegmentation(str(tmp_path / "empty"), generate=False)


# -- issue 24: shared data folders, dying parents ------------------------------------------------------------------
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: ensure_shapes in a subprocess; "slow" renders slowly (so that the other one starts meanwhile); with "foreign",
#: every other process's pid looks dead to it, as it does from another PID namespace (a container sharing the folder).
_ENSURE = ("import sys, time; import encoding.utils.files as files\n"
           "from encoding.datasets.prepare import shapes_render\n"
           "if sys.argv[2] == 'foreign': files.pid_alive = lambda pid: False\n"
           "if sys.argv[2] == 'slow':\n"
           "    real = shapes_render._scene_for\n"
           "    shapes_render._scene_for = lambda *a: (time.sleep(0.04), real(*a))[1]\n"
           "shapes_render.ensure_shapes(sys.argv[1], num_train=150, num_val=10, progress=False)")


def _complete_dataset(folder, num_train, num_val):
    names = [f"train_{i:05d}" for i in range(num_train)] + [f"val_{i:05d}" for i in range(num_val)]
    assert sorted(os.listdir(os.path.join(folder, "JPEGImages"))) == sorted(n + ".jpg" for n in names)
    assert sorted(os.listdir(os.path.join(folder, "SegmentationClass"))) == sorted(n + ".png" for n in names)
    for name in names[::7]:
        Image.open(os.path.join(folder, "SegmentationClass", name + ".png")).load()
    with open(os.path.join(folder, shapes.MARKER)) as f:
        assert json.load(f)["num_train"] == num_train


def _staging_files(root):
    """The scenes written so far into the staging folders under ``root`` (their ``.lock`` files are not folders)."""
    folders = [os.path.join(root, d) for d in os.listdir(root) if ".tmp-" in d and not d.endswith(".lock")]
    return [f for d in folders if os.path.isdir(os.path.join(d, "JPEGImages"))
            for f in os.listdir(os.path.join(d, "JPEGImages"))]


def test_two_first_generations_into_one_shared_root_make_one_complete_dataset(tmp_path):
    env = {**os.environ, "PYTHONPATH": ROOT}
    first = subprocess.Popen([sys.executable, "-c", _ENSURE, str(tmp_path), "slow"], env=env, cwd=ROOT,
                             stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not (os.path.isdir(tmp_path) and _staging_files(tmp_path)):  # the first is writing scenes
        assert first.poll() is None and time.monotonic() < deadline, first.stderr.read()
        time.sleep(0.05)
    second = subprocess.run([sys.executable, "-c", _ENSURE, str(tmp_path), "foreign"], env=env, cwd=ROOT,
                            capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stderr
    assert first.wait(timeout=300) == 0, first.stderr.read()
    _complete_dataset(str(tmp_path / "shapes-seed0-150-10"), 150, 10)
    assert sorted(os.listdir(tmp_path)) == [".shapes-seed0-150-10.lock", "shapes-seed0-150-10"]


def test_a_dataset_with_a_missing_file_is_generated_again(tmp_path):
    folder = shapes.ensure_shapes(str(tmp_path), seed=4, num_train=5, num_val=2, progress=False)
    mask = os.path.join(folder, "SegmentationClass", "train_00003.png")
    expected = open(mask, "rb").read()
    os.remove(mask)
    assert shapes.ensure_shapes(str(tmp_path), seed=4, num_train=5, num_val=2, progress=False) == folder
    assert open(mask, "rb").read() == expected
    assert len(ShapesSegmentation(str(tmp_path), split="train", seed=4, num_train=5, num_val=2, progress=False)) == 5


_GENERATE = ("import sys; from encoding.datasets.prepare import shapes_render; "
             "shapes_render.generate_shapes(sys.argv[1], num_train=4000, num_val=0, progress=False, workers=2)")


def _children(pid):
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(p) for p in f.read().split()]
    except OSError:
        return []


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_generation_workers_die_with_a_killed_parent(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", _GENERATE, str(tmp_path / "shapes")], cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": ROOT}, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while len(_children(proc.pid)) < 2 or not _staging_files(tmp_path):  # the workers are rendering
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
        time.sleep(0.05)
    workers = _children(proc.pid)
    proc.kill()  # kill -9 of the main process only
    try:
        proc.communicate(timeout=20)  # returns once every holder of its pipes (the workers) is gone
    except subprocess.TimeoutExpired:
        for pid in workers:
            os.kill(pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail("the workers outlived their parent, holding its pipes open")


def test_the_main_job_says_where_it_generates_the_dataset(tmp_path, monkeypatch, capsys):
    """train.py on the shapes dataset generates it on first use: one line names the folder and ENCODING_DATA; a run
    that finds it complete writes nothing and says nothing."""
    from conftest import TINY, load_script

    from encoding.datasets.prepare import location

    monkeypatch.setenv("ENCODING_DATA", str(tmp_path / "data"))
    small = {**ShapesSegmentation.__init__.__kwdefaults__, "num_train": 4, "num_val": 2}  # a quick generation
    monkeypatch.setattr(ShapesSegmentation.__init__, "__kwdefaults__", small)
    train = load_script("train")
    for run in ("first", "second"):
        monkeypatch.setattr(location, "_ANNOUNCED", set())  # as a new process: the second says nothing, not again
        train.main(TINY + ["--output-dir", str(tmp_path / run), "--dataset", "shapes"])
        said = [line for line in capsys.readouterr().out.splitlines() if line.startswith("data: ")]
        folder = tmp_path / "data" / "shapes-seed0-4-2"
        assert said == ([f"data: writing the generated shapes dataset to {folder} (the data root, from "
                         "ENCODING_DATA)"] if run == "first" else []), said
    assert os.path.isfile(folder / shapes.MARKER)
