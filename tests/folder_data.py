"""Tiny folder datasets for the tests (written under a tmp path): the four layouts, index / colour / 0-255 masks."""
import os

import numpy as np
from PIL import Image

COLORS = [(0, 0, 0), (255, 0, 0), (0, 0, 255)]


def sample(i, size=(24, 20), nclass=3):
    """An image and its index mask: a square of class ``1 + i % (nclass - 1)`` on background 0, a 255 border."""
    w, h = size
    g = np.random.default_rng(i)
    mask = np.zeros((h, w), dtype=np.uint8)
    cls = 1 + i % (nclass - 1)
    mask[4:14, 5:15] = cls
    mask[0, :] = 255
    image = (g.integers(0, 60, (h, w, 3)) + (mask[..., None] % 255) * 60).astype(np.uint8)
    return image, mask


def write_pair(image_dir, mask_dir, stem, i, encoding="index", ext=".jpg", nclass=3):
    os.makedirs(image_dir, exist_ok=True)
    os.makedirs(mask_dir, exist_ok=True)
    image, mask = sample(i, nclass=nclass)
    Image.fromarray(image).save(os.path.join(image_dir, stem + ext))
    if encoding == "color":
        rgb = np.zeros(mask.shape + (3,), dtype=np.uint8)
        for c, color in enumerate(COLORS):
            rgb[mask == c] = color
        rgb[mask == 255] = (255, 255, 255)
        Image.fromarray(rgb).save(os.path.join(mask_dir, stem + ".png"))
    elif encoding == "binary":
        Image.fromarray(np.where(mask == 255, 0, np.where(mask > 0, 255, 0)).astype(np.uint8)).save(
            os.path.join(mask_dir, stem + ".png"))
    elif encoding == "palette":
        im = Image.fromarray(mask, mode="L").convert("P")
        im.putpalette([v for c in COLORS for v in c] + [0] * (768 - 9))
        im.save(os.path.join(mask_dir, stem + ".png"))
    else:
        Image.fromarray(mask).save(os.path.join(mask_dir, stem + ".png"))


def make_folder(root, layout="flat", n_train=6, n_val=2, encoding="index", classes=None):
    """A folder dataset at ``root`` in ``layout``: flat, splitdirs, mmseg or lists; ``classes``: text of classes.yaml."""
    j = os.path.join
    stems = [f"img{i:02d}" for i in range(n_train + n_val)]
    for i, stem in enumerate(stems):
        split = "train" if i < n_train else "val"
        if layout == "flat" or layout == "lists":
            write_pair(j(root, "images"), j(root, "masks"), stem, i, encoding)
        elif layout == "splitdirs":
            write_pair(j(root, split, "images"), j(root, split, "masks"), stem, i, encoding)
        elif layout == "mmseg":
            write_pair(j(root, "img_dir", split), j(root, "ann_dir", split), stem, i, encoding)
    if layout == "lists":
        os.makedirs(j(root, "splits"), exist_ok=True)
        with open(j(root, "splits", "train.txt"), "w") as f:
            f.write("".join(s + "\n" for s in stems[:n_train]))
        with open(j(root, "splits", "val.txt"), "w") as f:
            f.write("".join(f"images/{s}.jpg masks/{s}.png\n" for s in stems[n_train:]))
    if classes is not None:
        with open(j(root, "classes.yaml"), "w") as f:
            f.write(classes)
    return root


def photo(w, h, seed=0):
    """A photograph-like ``h x w x 3`` uint8 image: smooth colour gradients, a bright disc and sensor noise."""
    g = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    base = np.stack([x / max(w, 1) * 180, y / max(h, 1) * 160, (x + y) / max(w + h, 1) * 200], axis=-1)
    disc = ((x - w * 0.6) ** 2 + (y - h * 0.4) ** 2) < (min(w, h) * 0.25) ** 2
    base[disc] += 60
    return np.clip(base + g.normal(0, 8, base.shape), 0, 255).astype(np.uint8)


def save_rotated_jpeg(path, array, orientation):
    """Save ``array`` as a JPEG whose EXIF orientation tag is ``orientation`` (6: shown turned 90 degrees right)."""
    exif = Image.Exif()
    exif[0x0112] = orientation
    Image.fromarray(array).save(path, exif=exif.tobytes(), quality=90)


def truncate(path, keep=0.5):
    """Cut the file ``path`` to ``keep`` of its bytes (a download or a copy that stopped)."""
    data = open(path, "rb").read()
    with open(path, "wb") as f:
        f.write(data[:int(len(data) * keep)])
    return path


def tree(root):
    """Every file and folder under ``root`` with its size and modification time: equal before and after = nothing
    was written there."""
    found = []
    for base, dirs, files in os.walk(root):
        for name in dirs + files:
            st = os.stat(os.path.join(base, name))
            found.append((os.path.relpath(os.path.join(base, name), root), st.st_size, st.st_mtime_ns))
    return sorted(found)
