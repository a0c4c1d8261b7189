"""Rendering the embedded ``shapes`` dataset: scene generation, forked workers, and the completion marker.

Each scene has a textured, noisy background (smooth colour fields, stripes or blotches, grain, a global light
gradient) and 1-4 objects of six classes -- disc, square, triangle, star, ring, bar -- with random colours (drawn
independently of the class, so only the shape tells the class), sizes, rotations, mild anisotropic scaling, shading
and texture. Objects may leave the frame and occlude each other (each keeps at least a third of its area visible).
Like PASCAL VOC, a thin band on every label boundary is marked ignore (255 on disk).

The scenes are generated once, deterministically per seed (every image has its own random stream, so the result does
not depend on generation order or on the number of worker processes), and written in the VOC layout that the real
datasets use::

    <root>/shapes/JPEGImages/<id>.jpg
    <root>/shapes/SegmentationClass/<id>.png          # 0 = background, 1..6 = objects, 255 = ignore
    <root>/shapes/ImageSets/{train,val,trainval}.txt
    <root>/shapes/shapes.json                         # marker: generator version + settings, written last

Generation goes into a staging folder that is renamed into place at the end, so an interrupted run never leaves a
dataset that looks complete; the marker is written only after every file is checked to be there, and a dataset with a
missing file is generated again. Generations of one folder take turns under a lock the kernel releases when its holder
dies (``<root>/.<folder>.lock``, :class:`~encoding.utils.rundir.FileLock`): processes sharing the data folder -- ranks,
or containers with their own PID namespaces -- never delete each other's work; the waiting ones find the dataset
done. Worker processes die with the process that forked them. :func:`ensure_shapes` is the prepare step
(``python -m encoding.datasets.prepare shapes``); :class:`~encoding.datasets.ShapesSegmentation` runs it on first use.
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import json
import math
import multiprocessing
import os
import shutil
from typing import Dict, List, Optional, Tuple

import numpy as np
from PIL import Image, ImageDraw, ImageFilter
from ...utils.progress import progress_bar as tqdm

from ..layout import (SHAPES_CLASSES, SHAPES_DEFAULT_NUM_TRAIN, SHAPES_DEFAULT_NUM_VAL, SHAPES_DEFAULT_SEED,
                      default_root, shapes_folder)
from ...utils.files import staged_dir
from ...utils.rundir import FileLock, die_with_parent
from .location import announce_writing

__all__ = ["GENERATOR_VERSION", "MARKER", "DEFAULT_SEED", "DEFAULT_NUM_TRAIN", "DEFAULT_NUM_VAL", "render_scene",
           "generate_shapes", "ensure_shapes"]

GENERATOR_VERSION = 2
DEFAULT_SEED, DEFAULT_NUM_TRAIN, DEFAULT_NUM_VAL = SHAPES_DEFAULT_SEED, SHAPES_DEFAULT_NUM_TRAIN, SHAPES_DEFAULT_NUM_VAL
#: Image sides are drawn uniformly from this range (inclusive), independently for height and width.
SIDE_RANGE = (128, 160)
#: Object size: circumradius drawn from [RADIUS_MIN, RADIUS_MAX_FRACTION * min(height, width)] pixels.
RADIUS_MIN, RADIUS_MAX_FRACTION = 12.0, 0.3
#: Inclusive range of the number of objects per scene.
NUM_OBJECTS = (1, 4)
#: Background clutter: number of soft blotches (inclusive range) and probability of a stripe/check texture.
BLOTCHES, BACKGROUND_TEXTURE_P = (0, 3), 0.6
#: Probability that an object carries a texture; minimum RGB distance between an object and what it covers.
OBJECT_TEXTURE_P, MIN_CONTRAST = 0.5, 70.0
#: HSV saturation ranges: muted backgrounds, vivid objects (like "stuff" and "things" in photos); hues are uniform
#: for both and independent of the object class.
BACKGROUND_SATURATION, OBJECT_SATURATION = (0.05, 0.45), (0.5, 1.0)
MARKER = "shapes.json"
_SUPERSAMPLE = 4
_SPLIT_STREAM = {"train": 0, "val": 1}


# ------------------------------------------------------------------------------------------------------ rendering
def _hsv_to_rgb(h: float, s: float, v: float) -> np.ndarray:
    i = int(h * 6.0) % 6
    f = h * 6.0 - int(h * 6.0)
    p, q, t = v * (1 - s), v * (1 - s * f), v * (1 - s * (1 - f))
    rgb = [(v, t, p), (q, v, p), (p, v, t), (p, q, v), (t, p, v), (v, p, q)][i]
    return np.array(rgb, dtype=np.float32) * 255.0


def _muted_colour(rng: np.random.Generator) -> np.ndarray:
    """A background ("stuff") colour: any hue, low to mid saturation."""
    return _hsv_to_rgb(rng.random(), rng.uniform(*BACKGROUND_SATURATION), rng.uniform(0.2, 0.85))


def _vivid_colour(rng: np.random.Generator) -> np.ndarray:
    """An object ("thing") colour: any hue -- the same distribution for every class -- and high saturation."""
    return _hsv_to_rgb(rng.random(), rng.uniform(*OBJECT_SATURATION), rng.uniform(0.45, 1.0))


def _smooth_field(rng: np.random.Generator, height: int, width: int, cells: int) -> np.ndarray:
    """Smooth random field in ``[-1, 1]`` (value noise: a small random grid upsampled bicubically)."""
    grid = rng.uniform(-1.0, 1.0, size=(cells, cells)).astype(np.float32)
    field = Image.fromarray(grid).resize((width, height), Image.BICUBIC)
    return np.clip(np.asarray(field), -1.0, 1.0)


def _coords(height: int, width: int) -> Tuple[np.ndarray, np.ndarray]:
    ys, xs = np.mgrid[0:height, 0:width].astype(np.float32)
    return ys, xs


def _pattern(rng: np.random.Generator, height: int, width: int) -> np.ndarray:
    """A zero-mean texture in about ``[-1, 1]``: stripes, checks, or smooth noise."""
    ys, xs = _coords(height, width)
    kind = rng.integers(3)
    angle = rng.uniform(0, math.pi)
    period = rng.uniform(5.0, 18.0)
    u = xs * math.cos(angle) + ys * math.sin(angle)
    if kind == 0:
        return np.sin(2 * math.pi * u / period)
    if kind == 1:
        v = -xs * math.sin(angle) + ys * math.cos(angle)
        return np.sign(np.sin(2 * math.pi * u / period) * np.sin(2 * math.pi * v / period)) * 0.6
    return _smooth_field(rng, height, width, int(rng.integers(8, 20)))


def _background(rng: np.random.Generator, height: int, width: int) -> np.ndarray:
    base = _muted_colour(rng)
    image = np.broadcast_to(base, (height, width, 3)).astype(np.float32)
    for cells, amplitude in ((3, 45.0), (7, 20.0)):
        tint = rng.normal(0.0, 1.0, 3).astype(np.float32)
        image = image + _smooth_field(rng, height, width, cells)[..., None] * amplitude * (0.6 + 0.4 * tint)
    if rng.random() < BACKGROUND_TEXTURE_P:
        image = image + _pattern(rng, height, width)[..., None] * rng.uniform(6.0, 22.0)
    for _ in range(int(rng.integers(BLOTCHES[0], BLOTCHES[1] + 1))):  # soft blotches of other "stuff" colours
        blob = _blotch(rng, height, width)
        image = image * (1 - blob[..., None]) + _muted_colour(rng) * blob[..., None]
    return image


def _blotch(rng: np.random.Generator, height: int, width: int) -> np.ndarray:
    """A soft-edged irregular blob (alpha in ``[0, 1]``) so that not every coloured region is an object."""
    canvas = Image.new("L", (width, height), 0)
    draw = ImageDraw.Draw(canvas)
    cx, cy = rng.uniform(0, width), rng.uniform(0, height)
    radius = rng.uniform(12, 0.45 * min(height, width))
    angles = np.sort(rng.uniform(0, 2 * math.pi, int(rng.integers(7, 13))))
    radii = radius * rng.uniform(0.5, 1.0, angles.size)
    draw.polygon([(cx + r * math.cos(a), cy + r * math.sin(a)) for a, r in zip(angles, radii)], fill=255)
    canvas = canvas.filter(ImageFilter.GaussianBlur(radius * 0.35))
    return np.asarray(canvas, dtype=np.float32) / 255.0 * rng.uniform(0.4, 0.8)


def _shape_outline(cls: int, rng: np.random.Generator) -> Tuple[List[Tuple[float, float]], float]:
    """Unit-size polygon (or ``[]`` for round shapes) and the inner-radius ratio of rings."""
    if cls == 2:  # square
        return [(-0.8, -0.8), (0.8, -0.8), (0.8, 0.8), (-0.8, 0.8)], 0.0
    if cls == 3:  # triangle (equilateral, circumradius 1.15)
        return [(1.15 * math.cos(a), 1.15 * math.sin(a)) for a in (-math.pi / 2, math.pi / 6, 5 * math.pi / 6)], 0.0
    if cls == 4:  # five-pointed star
        inner = rng.uniform(0.4, 0.5)
        return [((1.2 if k % 2 == 0 else 1.2 * inner) * math.cos(-math.pi / 2 + k * math.pi / 5),
                 (1.2 if k % 2 == 0 else 1.2 * inner) * math.sin(-math.pi / 2 + k * math.pi / 5)) for k in range(10)], 0.0
    if cls == 6:  # bar
        half = rng.uniform(0.26, 0.36)
        return [(-1.3, -half), (1.3, -half), (1.3, half), (-1.3, half)], 0.0
    return [], (rng.uniform(0.5, 0.68) if cls == 5 else 0.0)  # disc / ring


def _object_alpha(cls: int, rng: np.random.Generator, height: int, width: int) -> np.ndarray:
    """Anti-aliased coverage (``[0, 1]``, full image size) of one randomly placed, sized and rotated object."""
    radius = rng.uniform(RADIUS_MIN, RADIUS_MAX_FRACTION * min(height, width))
    cx = rng.uniform(-0.3 * radius, width + 0.3 * radius)
    cy = rng.uniform(-0.3 * radius, height + 0.3 * radius)
    angle = rng.uniform(0, 2 * math.pi)
    sx, sy = radius * rng.uniform(0.85, 1.15), radius * rng.uniform(0.85, 1.15)
    polygon, inner = _shape_outline(cls, rng)
    s = _SUPERSAMPLE
    canvas = Image.new("L", (width * s, height * s), 0)
    draw = ImageDraw.Draw(canvas)
    cos_a, sin_a = math.cos(angle), math.sin(angle)

    def place(x: float, y: float) -> Tuple[float, float]:
        x, y = x * sx, y * sy
        return ((cx + x * cos_a - y * sin_a) * s, (cy + x * sin_a + y * cos_a) * s)

    if polygon:
        draw.polygon([place(x, y) for x, y in polygon], fill=255)
    else:  # ellipse as a dense polygon so that rotation and anisotropy apply uniformly
        ring = [(math.cos(t), math.sin(t)) for t in np.linspace(0, 2 * math.pi, 72, endpoint=False)]
        draw.polygon([place(x, y) for x, y in ring], fill=255)
        if inner:
            draw.polygon([place(inner * x, inner * y) for x, y in ring], fill=0)
    small = canvas.resize((width, height), Image.BOX)
    return np.asarray(small, dtype=np.float32) / 255.0


def _object_fill(rng: np.random.Generator, height: int, width: int, avoid: np.ndarray) -> np.ndarray:
    """Shaded, textured colour field for an object, with a colour clearly different from ``avoid``."""
    colour = _vivid_colour(rng)
    for _ in range(12):
        if np.linalg.norm(colour - avoid) > MIN_CONTRAST:
            break
        colour = _vivid_colour(rng)
    ys, xs = _coords(height, width)
    angle = rng.uniform(0, 2 * math.pi)
    light = (xs * math.cos(angle) + ys * math.sin(angle)) / max(height, width)
    fill = colour + (light[..., None] * rng.uniform(20, 60))
    if rng.random() < OBJECT_TEXTURE_P:
        fill = fill + _pattern(rng, height, width)[..., None] * rng.uniform(5.0, 15.0)
    return fill


def _ignore_boundary(label: np.ndarray) -> np.ndarray:
    """Pixels whose 3x3 neighbourhood holds another label (a 2-pixel band along every boundary)."""
    padded = np.pad(label, 1, mode="edge")
    height, width = label.shape
    edge = np.zeros(label.shape, dtype=bool)
    for dy in (0, 1, 2):
        for dx in (0, 1, 2):
            edge |= padded[dy:dy + height, dx:dx + width] != label
    return edge


def render_scene(rng: np.random.Generator, height: int, width: int,
                 num_objects: Tuple[int, int] = NUM_OBJECTS) -> Tuple[np.ndarray, np.ndarray]:
    """Render one scene.

    Args:
        rng: the random stream (the scene is a pure function of its state).
        height, width: image size.
        num_objects: inclusive range of the number of objects tried (an object that cannot be placed without
            hiding two thirds of another is dropped).

    Returns:
        ``(image, label)``: ``uint8 H x W x 3`` and ``uint8 H x W`` (0 background, 1..6 objects, 255 ignore).
    """
    image = _background(rng, height, width)
    label = np.zeros((height, width), dtype=np.uint8)
    owner = np.full((height, width), -1, dtype=np.int16)  # index of the object visible at each pixel
    areas: List[int] = []
    for _ in range(int(rng.integers(num_objects[0], num_objects[1] + 1))):
        cls = int(rng.integers(1, len(SHAPES_CLASSES)))
        for _attempt in range(6):
            alpha = _object_alpha(cls, rng, height, width)
            inside = alpha >= 0.5
            if inside.sum() < 40:
                continue
            new_owner = np.where(inside, len(areas), owner)
            visible = np.bincount(new_owner[new_owner >= 0].ravel(), minlength=len(areas) + 1)
            if all(visible[k] >= areas[k] / 3 for k in range(len(areas))):
                break
        else:
            continue
        mean_under = image[inside].mean(axis=0)
        fill = _object_fill(rng, height, width, mean_under)
        image = image * (1 - alpha[..., None]) + fill * alpha[..., None]
        label[inside] = cls
        owner = new_owner
        areas.append(int(inside.sum()))
    ys, xs = _coords(height, width)
    angle = rng.uniform(0, 2 * math.pi)
    image = image * (1 + 0.15 * ((xs * math.cos(angle) + ys * math.sin(angle)) / max(height, width) - 0.5))[..., None]
    image = np.asarray(Image.fromarray(np.clip(image, 0, 255).astype(np.uint8)).filter(
        ImageFilter.GaussianBlur(rng.uniform(0.3, 0.8))), dtype=np.float32)
    image = image + rng.normal(0.0, rng.uniform(2.0, 7.0), image.shape)
    label[_ignore_boundary(label)] = 255
    return np.clip(image + 0.5, 0, 255).astype(np.uint8), label


# ----------------------------------------------------------------------------------------------------- generation
def _config(seed: int, num_train: int, num_val: int) -> Dict[str, object]:
    return {"generator_version": GENERATOR_VERSION, "seed": int(seed), "num_train": int(num_train),
            "num_val": int(num_val), "side_range": list(SIDE_RANGE)}


def _scene_for(seed: int, split: str, index: int) -> Tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng([int(seed), _SPLIT_STREAM[split], int(index)])
    height, width = (int(v) for v in rng.integers(SIDE_RANGE[0], SIDE_RANGE[1] + 1, size=2))
    return render_scene(rng, height, width)


def _missing_files(folder: str, names: List[str]) -> List[str]:
    """The image and mask files of ``names`` that are not in ``folder`` (two directory listings)."""
    missing = []
    for sub, ext in (("JPEGImages", ".jpg"), ("SegmentationClass", ".png")):
        try:
            present = set(os.listdir(os.path.join(folder, sub)))
        except OSError:
            present = set()
        missing += [os.path.join(folder, sub, n + ext) for n in names if n + ext not in present]
    return missing


def _expected_names(config: Dict[str, object]) -> List[str]:
    return [f"{split}_{i:05d}" for split in ("train", "val") for i in range(int(config[f"num_{split}"]))]


def _is_complete(folder: str, config: Dict[str, object]) -> bool:
    """The marker matches ``config`` and every image and mask is there (a missing file: generate again)."""
    try:
        with open(os.path.join(folder, MARKER), encoding="utf-8") as f:
            if json.load(f) != config:
                return False
    except (OSError, ValueError):
        return False
    return not _missing_files(folder, _expected_names(config))


def _write_scene(staging: str, seed: int, job: Tuple[str, int]) -> str:
    """Render the scene ``job = (split, index)`` and write its image and label into ``staging``; returns its name."""
    split, index = job
    image, label = _scene_for(seed, split, index)
    name = f"{split}_{index:05d}"
    Image.fromarray(image).save(os.path.join(staging, "JPEGImages", name + ".jpg"), quality=90)
    Image.fromarray(label).save(os.path.join(staging, "SegmentationClass", name + ".png"))
    return name


def _write_scenes(staging: str, seed: int, jobs: List[Tuple[str, int]], workers: int, progress: bool) -> List[str]:
    """Write every ``(split, index)`` scene of ``jobs``, in ``workers`` forked processes when more than one; returns
    their names, in the order of ``jobs``."""
    write = functools.partial(_write_scene, staging, seed)
    with contextlib.ExitStack() as stack:
        if workers > 1 and "fork" in multiprocessing.get_all_start_methods():
            # every scene has its own random stream: the files do not depend on the order or the process
            context = multiprocessing.get_context("fork")
            pool = stack.enter_context(concurrent.futures.ProcessPoolExecutor(
                workers, mp_context=context, initializer=die_with_parent, initargs=(os.getpid(),)))
            names = pool.map(write, jobs, chunksize=16)
        else:
            names = map(write, jobs)
        return list(tqdm(names, total=len(jobs), desc="generating shapes", unit="img", smoothing=0,
                         disable=not progress))  # smoothing 0: the mean rate (results come 16 at a time)


def _lock(folder: str) -> FileLock:
    """The lock of generating ``folder``: ``<parent>/.<name>.lock``, held until this process releases it or dies."""
    parent, name = os.path.split(os.path.abspath(folder))
    os.makedirs(parent, exist_ok=True)
    return FileLock(os.path.join(parent, f".{name}.lock"))


def _generate(folder: str, seed: int, num_train: int, num_val: int, progress: bool, workers: Optional[int]) -> None:
    """Generate ``folder``; the caller holds its :func:`_lock`, so every staging folder of it is a dead one's."""
    parent, name = os.path.split(os.path.abspath(folder))
    for leftover in os.listdir(parent):
        if leftover.startswith(f".{name}.tmp-"):
            shutil.rmtree(os.path.join(parent, leftover), ignore_errors=True)
    config = _config(seed, num_train, num_val)
    jobs = [(split, i) for split, n in (("train", num_train), ("val", num_val)) for i in range(n)]
    if workers is None:
        workers = min(os.cpu_count() or 1, 8) if len(jobs) > 256 else 1
    with staged_dir(folder, replace=True) as staging:
        for sub in ("JPEGImages", "SegmentationClass", "ImageSets"):
            os.makedirs(os.path.join(staging, sub))
        names = _write_scenes(staging, seed, jobs, workers, progress)
        lists = {"train": names[:num_train], "val": names[num_train:], "trainval": names}
        for split, names in lists.items():
            with open(os.path.join(staging, "ImageSets", split + ".txt"), "w", encoding="utf-8") as f:
                f.write("".join(n + "\n" for n in names))
        missing = _missing_files(staging, _expected_names(config))
        if missing:  # never mark an incomplete dataset complete
            raise RuntimeError(f"shapes generation lost {len(missing)} file(s), e.g. {missing[0]}; run it again")
        with open(os.path.join(staging, MARKER), "w", encoding="utf-8") as f:
            json.dump(config, f, indent=1, sort_keys=True)


def generate_shapes(folder: str, *, seed: int = DEFAULT_SEED, num_train: int = DEFAULT_NUM_TRAIN,
                    num_val: int = DEFAULT_NUM_VAL, progress: bool = True, workers: Optional[int] = None) -> str:
    """Generate the dataset into ``folder`` (replacing what is there), atomically, under the folder's lock.

    Args:
        workers: processes that render scenes (default: one per CPU core, up to 8, for more than 256 scenes);
            the result is the same for any number.

    Returns:
        ``folder``.
    """
    with _lock(folder):
        _generate(folder, seed, num_train, num_val, progress, workers)
    return folder


def ensure_shapes(root: Optional[str] = None, *, seed: int = DEFAULT_SEED, num_train: int = DEFAULT_NUM_TRAIN,
                  num_val: int = DEFAULT_NUM_VAL, overwrite: bool = False, progress: bool = True) -> str:
    """Return the ``shapes`` folder under ``root``, generating it first if it is absent, incomplete or stale.

    The folder is ``<root>/shapes`` for the default settings and ``<root>/shapes-seed<seed>-<train>-<val>``
    otherwise, so different settings never overwrite each other. Processes that find it missing at the same time
    take turns: one generates, the others wait for its lock and find the dataset complete. Generating, it says
    where it writes (:func:`~.location.announce_writing`).
    """
    root = os.path.expanduser(root or default_root())
    folder = os.path.join(root, shapes_folder(seed, num_train, num_val))
    config = _config(seed, num_train, num_val)
    if overwrite or not _is_complete(folder, config):
        with _lock(folder):
            if overwrite or not _is_complete(folder, config):  # not done by another process meanwhile
                announce_writing("the generated shapes dataset", folder, root)
                _generate(folder, seed, num_train, num_val, progress, None)
    return folder
