"""Segment images: for each input write ``<name>_mask.png`` (coloured mask) and ``<name>_overlay.png`` (the image
blended with the mask, with a legend of the classes present) into ``--out-dir``.

    python experiments/segmentation/demo.py image.jpg --resume runs/shapes/unet/default/model_best.pth
    python experiments/segmentation/demo.py a.jpg b.png --model-zoo fcn_resnet50_voc --out-dir demo/ --multi-scale
    python experiments/segmentation/demo.py photos/ "more/*.jpg" --resume model_best.pth

A folder stands for every image in it (sorted by name), a quoted glob for the files it matches.

Any image size; JPEG or PNG; grey-scale (16-bit too), palette and RGBA images are converted to RGB, EXIF-rotated
photos are read upright. Inputs of the same name in different folders keep their folders under ``--out-dir``; an
existing output is refused unless ``--overwrite``. Only the headers are read before any work; images are then
decoded once and processed one at a time (a progress bar on stderr over several). The network's options come from
the checkpoint unless given. Runs on the CPU when there is no GPU.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from options import parse_args  # noqa: E402

from encoding.engine.builders import select_devices  # noqa: E402
from encoding.datasets.base import check_image  # noqa: E402
from encoding.inference.demo import demo_outputs, expand_images, segment_files  # noqa: E402
from encoding.inference.evaluation import EvaluationConfig, evaluation_module  # noqa: E402
from encoding.utils.cli import run_cli  # noqa: E402
from encoding.utils.progress import progress_bar  # noqa: E402


def main(argv=None) -> list:
    """Run ``demo.py`` with ``argv``; returns the written ``(mask, overlay)`` paths, one pair per image."""
    args = parse_args(argv, "demo")
    images = expand_images(args.images)  # folders and quoted globs, as users type them
    for path in images:  # every input and output is checked before any work (headers only: decoded once, below)
        check_image(path, decode=False)
    outputs = demo_outputs(images, args.out_dir, args.overwrite)
    device = select_devices(None, use_cuda=not args.no_cuda).model_device  # the first GPU, else the CPU
    config = EvaluationConfig.from_options(args)
    model = evaluation_module(config.network(device), config)
    results = segment_files(model, images, outputs, args.dataset, device, args.alpha, args.blend_background)
    with progress_bar(total=len(images), desc="demo", unit="image", disable=len(images) < 2, leave=False,
                      dynamic_ncols=True) as bar:  # on stderr; one line per image on stdout
        for path, (mask_path, overlay_path), present in zip(images, outputs, results):
            bar.write(f"{path}: {', '.join(present)} -> {mask_path}, {overlay_path}")
            bar.update()
    return outputs


def cli(argv=None) -> int:
    """``main`` for the command line: an ``EncodingError`` is one line on stderr, a bug keeps its traceback
    (``--traceback`` shows them all); returns the exit status."""
    return run_cli("demo.py", main, argv)


if __name__ == "__main__":
    sys.exit(cli())
