"""Bad data met by a run: a broken validation image fails the evaluation but keeps the trained epoch (and
``--verify-data`` finds it first), a missing dataset names its prepare script, skipped samples are counted across
DataLoader workers, and an edited label-count cache entry is counted again (issues 12 and 35).
"""
import json
import os
import pickle

import pytest
import torch
from conftest import ROOT, TINY, tiny_shapes_pair
from torch.utils.data import DataLoader
from training_runs import load_train_script, run_dir_of

from encoding.datasets import DatasetError, get_segmentation_dataset
from encoding.utils import load_checkpoint
from encoding.utils.checkpoint import CHECKPOINT_NAME


SMALL = dict(num_train=8, num_val=4, progress=False)


def _truncate(path):
    payload = open(path, "rb").read()
    with open(path, "wb") as f:
        f.write(payload[:len(payload) // 3])
    return path


def _truncate_first_val_image(data):
    return _truncate(os.path.join(data, "shapes-seed0-8-4", "JPEGImages", "val_00000.jpg"))


def test_failing_evaluation_keeps_the_trained_epoch_and_verify_data_finds_it_first(tmp_path, capsys):
    data = tmp_path / "data"  # a set of its own: one validation image is broken
    tiny_shapes_pair(data)
    bad = _truncate_first_val_image(data)
    script = load_train_script()
    out = str(tmp_path / "runs")
    # a bad file found by --verify-data before the run is the data refused (2); met during the run, it fails it (1)
    assert script.cli(TINY + ["--output-dir", out, "--verify-data"], datasets=tiny_shapes_pair(data)) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert bad in err and not os.path.exists(os.path.join(run_dir_of(out), CHECKPOINT_NAME))
    assert script.cli(TINY + ["--output-dir", out], datasets=tiny_shapes_pair(data)) == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "evaluation after epoch 0 failed" in err and bad in err
    assert load_checkpoint(os.path.join(run_dir_of(out), CHECKPOINT_NAME))["epoch"] == 0
    with pytest.warns(RuntimeWarning, match="skipping bad sample"):  # the val split drops it when built
        datasets = tiny_shapes_pair(data, skip_bad=True)
    assert len(datasets[1]) == 3 and datasets[1].num_skipped == 1
    assert script.cli(TINY + ["--output-dir", out, "--verify-data", "--skip-bad", "--overwrite"],
                      datasets=datasets) == 0
    assert "3 val samples" in capsys.readouterr().out


def test_verify_data_drops_bad_training_samples_before_the_loaders_and_the_schedule_count_them(tmp_path, capsys):
    """--verify-data --skip-bad with 3 of 8 training images broken: the samples were dropped after the loaders had
    counted 8, so each epoch drew 8 indices over the 5 left (three trained twice) and the schedule counted 8 steps.
    Dropped as the run is built now; a run built without it refuses a drop by train(verify_data=True)."""
    import warnings

    from encoding.engine import TrainingConfig, build_training, train
    from encoding.engine.hooks import RunFailed

    data = tmp_path / "data"
    tiny_shapes_pair(data)
    for i in range(3):
        _truncate(os.path.join(data, "shapes-seed0-8-4", "JPEGImages", f"train_{i:05d}.jpg"))

    def built(*argv):
        options = load_train_script().parse_args(TINY + ["--output-dir", str(tmp_path / "runs"), *argv])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # "skipping bad sample", met while verifying
            return build_training(TrainingConfig(**vars(options)), datasets=tiny_shapes_pair(data, skip_bad=True))

    run = built("--batch-size", "1", "--verify-data", "--skip-bad")
    assert "verify: dropped 3 bad sample(s) of 'train'" in capsys.readouterr().out
    assert len(run.train_loader) == 5 and sorted(i for _, i in run.train_loader.sampler) == list(range(5))
    assert len(run.train_loader.dataset) == 5
    with pytest.raises(RunFailed, match=r"verify: 3 bad sample\(s\) dropped after the loaders counted them"), \
            warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        train(built("--batch-size", "1", "--skip-bad"), verify_data=True)


@pytest.mark.parametrize("name", ["pascal_voc", "pascal_aug", "ade20k", "citys", "pcontext"])
def test_missing_dataset_names_an_existing_prepare_script_and_data_root(name, tmp_path):
    with pytest.raises(DatasetError) as info:
        get_segmentation_dataset(name, root=str(tmp_path))
    script = str(info.value).split("run python ", 1)[1].split(",", 1)[0]
    assert os.path.isfile(os.path.join(ROOT, script)) and "--data-root" in str(info.value)


def test_skip_bad_counts_samples_skipped_in_worker_processes(tmp_path):
    get_segmentation_dataset("shapes", root=str(tmp_path), split="val", **SMALL)
    _truncate_first_val_image(tmp_path)
    with pytest.warns(RuntimeWarning, match="skipping bad sample"):
        dataset = get_segmentation_dataset("shapes", root=str(tmp_path), split="val", skip_bad=True, **SMALL)
        dataset[0]
    assert dataset.num_skipped == 1
    dataset = get_segmentation_dataset("shapes", root=str(tmp_path), split="train", mode="train", skip_bad=True,
                                       **SMALL)
    _truncate(dataset.images[0])
    torch.manual_seed(0)  # an order in which both workers meet the bad sample (counted twice before)
    loader = DataLoader(dataset, batch_size=1, num_workers=2, shuffle=True, persistent_workers=True)
    for _ in range(4):  # training: the next sample stands in; the bad one met by both workers over the epochs
        assert len(list(loader)) == len(dataset)
    assert dataset.num_skipped == 1  # counted once, not once per worker that met it
    assert pickle.loads(pickle.dumps(dataset)).num_skipped == 1


@pytest.mark.parametrize("edit", [lambda e: e.update(pixels=e["pixels"][:-1]),
                                  lambda e: e.update(pixels=["x"] * len(e["pixels"])),
                                  lambda e: e.update(pixels=[-5] * len(e["pixels"])),
                                  lambda e: e.update(image_pixels=None),
                                  lambda e: e.update(pixels=[0] * len(e["pixels"]))])
def test_an_edited_label_count_cache_entry_is_counted_again(edit, tmp_path):
    from conftest import tiny_shapes_pair

    from encoding.datasets.class_weights import CACHE_FILE, label_counts
    from encoding.nn import SegmentationLosses

    train, _ = tiny_shapes_pair(str(tmp_path / "data"), num_val=2)
    first = label_counts(train, progress=False)
    cache = os.path.join(train.dataset_dir if hasattr(train, "dataset_dir") else
                         train.dataset.dataset_dir, CACHE_FILE)
    with open(cache) as f:
        entries = json.load(f)
    (key,) = entries
    edit(entries[key])
    with open(cache, "w") as f:
        json.dump(entries, f)
    with pytest.warns(UserWarning, match="edited or corrupt entry"):
        again = label_counts(train, progress=False)
    assert again["cached"] is False and again["pixels"] == first["pixels"]
    from encoding.datasets.class_weights import class_weights
    SegmentationLosses(nclass=len(first["pixels"]), weight=class_weights(again).float())
