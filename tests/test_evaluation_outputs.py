"""What test.py scores and saves: whole images at single scale, and predicted masks at their images' size
(``--save-pred``, refused with ``--mode val``) (issue 23).
"""
import os

import numpy as np
from conftest import load_script, tiny_eval_set
from PIL import Image
from training_runs import run_script


def test_testval_single_scale_scores_whole_images(tiny_run, tmp_path):
    base, checkpoint, _ = tiny_run
    test = load_script("test")
    scores = test.main(["--resume", checkpoint, "--mode", "testval", "--limit", "3", "--workers", "0",
                        "--out-dir", str(tmp_path)], data=tiny_eval_set(base, "testval"))
    assert 0 <= scores["mIoU"] <= 1 and scores["confusion"].sum() > 0


def test_saved_predictions_have_the_size_of_their_images(tiny_run, tmp_path, capsys):
    base, checkpoint, _ = tiny_run
    test = load_script("test")
    test.main(["--resume", checkpoint, "--save-pred", str(tmp_path / "preds"), "--workers", "0", "--out-dir",
               str(tmp_path)], data=tiny_eval_set(base, "testval"))  # default mode with --save-pred: testval
    images = tiny_eval_set(base, "test").images
    for path in images:
        name = os.path.splitext(os.path.basename(path))[0] + ".png"
        assert Image.open(tmp_path / "preds" / name).size == Image.open(path).size
    assert np.asarray(Image.open(tmp_path / "preds" / name)).max() < 7
    capsys.readouterr()
    status = run_script("test", ["--resume", checkpoint, "--mode", "val", "--save-pred", str(tmp_path / "v")])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and len(err) == 1 and "--save-pred" in err[0] and not (tmp_path / "v").exists()
