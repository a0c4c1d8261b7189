"""Segment images: for each input write ``<name>_mask.png`` (coloured mask) and ``<name>_overlay.png`` (the image
blended with the mask, with a legend of the classes present) into ``--out-dir``.

    python experiments/segmentation/demo.py image.jpg --resume runs/shapes/unet/default/model_best.pth
    python experiments/segmentation/demo.py a.jpg b.png --model-zoo fcn_resnet50_voc --out-dir demo/ --multi-scale

Any image size; JPEG or PNG; grey-scale, palette and RGBA images are converted to RGB. The network's options come
from the checkpoint unless given. Runs on the CPU when there is no GPU.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from options import parse_args  # noqa: E402

from encoding.builders import select_devices  # noqa: E402
from encoding.datasets import DatasetError, datasets  # noqa: E402
from encoding.engine.inference import (EvaluationConfig, denormalize, load_model, multi_scale,  # noqa: E402
                                       overlay_with_legend, read_image, save_png, segment)
from encoding.utils import CheckpointError, colorize  # noqa: E402
from encoding.utils.cli import run_cli  # noqa: E402


def _outputs(out_dir: str, path: str) -> tuple:
    stem = os.path.splitext(os.path.basename(path))[0]
    return os.path.join(out_dir, f"{stem}_mask.png"), os.path.join(out_dir, f"{stem}_overlay.png")


def main(argv=None) -> list:
    """Run ``demo.py`` with ``argv``; returns the written ``(mask, overlay)`` paths, one pair per image."""
    args = parse_args(argv, "demo")
    images = [(path, read_image(path)) for path in args.images]  # every input is checked before any work
    device = select_devices(None, use_cuda=not args.no_cuda).model_device  # the first GPU, else the CPU
    config = EvaluationConfig.from_options(args)
    model = multi_scale(load_model(config, device), config)
    dataset = datasets[args.dataset]
    os.makedirs(args.out_dir, exist_ok=True)
    written = []
    for path, image in images:
        labels = segment(model, image, device)
        mask_path, overlay_path = _outputs(args.out_dir, path)
        save_png(colorize(labels, args.dataset), mask_path)
        save_png(overlay_with_legend(denormalize(image), labels, args.dataset, dataset.CLASSES, args.alpha), overlay_path)
        present = ", ".join(dataset.CLASSES[c] for c in labels.unique().tolist())
        print(f"{path}: {present} -> {mask_path}, {overlay_path}")
        written.append((mask_path, overlay_path))
    return written


def cli(argv=None) -> int:
    """``main`` for the command line: known failures become one line on stderr; returns the exit status."""
    return run_cli("demo.py", main, argv, (CheckpointError, DatasetError, ValueError, RuntimeError, OSError))


if __name__ == "__main__":
    sys.exit(cli())
