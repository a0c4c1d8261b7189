"""Evaluate a segmentation model on a dataset split; optionally write its predictions as coloured PNGs.

    python experiments/segmentation/test.py --resume runs/shapes/unet/default/model_best.pth
    python experiments/segmentation/test.py --resume model_best.pth --multi-scale --save-pred preds/
    python experiments/segmentation/test.py --resume model_best.pth --mode slide --window 512 --stride 341
    python experiments/segmentation/test.py --model-zoo fcn_resnet50_voc --dataset pascal_voc
    python experiments/segmentation/test.py --torchvision-weights --model deeplab --backbone resnet50 \\
        --dataset pascal_voc
    torchrun --nproc_per_node 2 experiments/segmentation/test.py --resume model_best.pth   # confusion matrices summed

The network's options (dataset, model, backbone, ...) come from the checkpoint's training options unless given.
Modes: ``testval`` (default) scores whole images at their size, one per device at a time, as PyTorch-Encoding's
``test.py --eval`` and mmsegmentation do; ``val`` scores resized centre crops in batches exactly as ``train.py``
validates, through DataParallelModel on ``--device-ids``; ``test`` (default for the ``test`` split, which has no
masks) only predicts; ``slide`` (mmsegmentation's ``mode='slide'``) is ``testval`` (``test`` on the test split) by
overlapping ``--window`` windows every ``--stride`` pixels. Prints the protocol, pixAcc / mIoU and the per-class
table; writes metrics.json (its first key: the protocol), confusion.png and iou.png; with ``--save-pred DIR`` the
predictions, DIR/errors/<name>.png (correct / wrong / ignored over each image) and worst_images.png.
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from options import parse_args  # noqa: E402

from encoding.config.evaluation import protocol  # noqa: E402
from encoding.engine import evaluate, evaluate_images  # noqa: E402
from encoding.inference.error_maps import WORST_NAME, error_maps_of  # noqa: E402
from encoding.inference.evaluation_plots import CONFUSION_NAME, IOU_NAME, remove_stale, write_charts  # noqa: E402
from encoding.inference.evaluation import EvaluationConfig, build_evaluation  # noqa: E402
from encoding.utils import format_table, is_main_process  # noqa: E402
from encoding.utils.cli import run_cli  # noqa: E402
from encoding.utils.files import atomic_write  # noqa: E402
from encoding.utils.table import scores_to_json  # noqa: E402


def main(argv=None, data=None) -> dict:
    """Run ``test.py`` with ``argv`` (on the dataset ``data`` when given); returns the scores (``{}`` in ``test``
    mode, which only predicts)."""
    args = parse_args(argv, "test")
    job = build_evaluation(EvaluationConfig.from_options(args), data)
    scoring = protocol(job.config)
    if is_main_process():
        print(f"{job.describe()}; scores {scoring}")
    maps = error_maps_of(job)

    def on_outputs(outputs, batch) -> None:
        job.write_predictions(outputs, batch)
        if maps is not None:
            maps(outputs, batch)
    if args.mode == "val":
        result = evaluate(job.model, job.loader, job.metric, job.input_device, job.amp_dtype,
                          on_outputs=on_outputs)
    else:
        result = evaluate_images(job.model, job.loader, None if args.mode == "test" else job.metric, job.devices,
                                 job.amp_dtype, on_outputs=on_outputs)
    worst = maps.worst_images() if maps is not None else None  # every rank: their worst images are gathered
    if job.writer is not None:
        print(f"wrote {len(job.writer.written)} prediction(s) to {job.writer.out_dir}"
              + (f" and their error maps to {maps.out_dir}" if maps is not None else ""))
    if not result or not is_main_process():
        return result or {}
    print(f"{scoring} ({args.split} split):")
    print(format_table(result, job.class_names))
    report = {"protocol": scoring, "split": args.split, "mode": args.mode, "inference": args.inference,
              "weights": job.config.weights, "scales": list(args.scales) if args.multi_scale else [1.0],
              "flip": args.multi_scale, **scores_to_json(result, job.class_names)}
    os.makedirs(job.out_dir, exist_ok=True)
    path = atomic_write(os.path.join(job.out_dir, "metrics.json"), json.dumps(report, indent=2) + "\n")
    pictures = write_charts(result, job.class_names, job.out_dir)
    if worst:
        pictures.append(maps.write_gallery(os.path.join(job.out_dir, WORST_NAME), worst))
    remove_stale(job.out_dir, pictures, (CONFUSION_NAME, IOU_NAME, WORST_NAME))  # an earlier evaluation's
    print(f"pixAcc {result['pixAcc']:.4f}, mIoU {result['mIoU']:.4f} ({scoring}); wrote {path}"
          + "".join(f", {os.path.basename(p)}" for p in pictures))
    return result


def cli(argv=None, data=None) -> int:
    """``main`` for the command line: an ``EncodingError`` is one line on stderr, a bug keeps its traceback
    (``--traceback`` shows them all); returns the exit status."""
    return run_cli("test.py", main, argv, data=data)


if __name__ == "__main__":
    sys.exit(cli())
