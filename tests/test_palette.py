"""Palettes, colorize, get_mask_pallete and overlay."""
import numpy as np
import pytest
import torch
from PIL import Image

from encoding.utils import (PALETTE_NAMES, colorize, get_ignore_color, get_mask_pallete, get_palette, overlay,
                            voc_palette)

NUM_CLASS = {"pascal_voc": 21, "pascal_aug": 21, "coco": 21, "pcontext": 59, "detail": 59, "ade20k": 150,
             "citys": 19, "shapes": 7}


def voc_color(index):
    """VOC colour map written out bit by bit: bit 3k+c of the index is bit 7-k of channel c."""
    bits = [(index >> b) & 1 for b in range(24)]
    return tuple(sum(bits[3 * k + c] << (7 - k) for k in range(8)) for c in range(3))


def test_voc_palette_is_the_bit_interleaved_map():
    palette = voc_palette()
    assert len(palette) == 256 and len(set(palette)) == 256
    assert all(palette[i] == voc_color(i) for i in range(256))
    assert palette[0] == (0, 0, 0) and palette[1] == (128, 0, 0) and palette[15] == (192, 128, 128)  # person
    assert palette[255] == (224, 224, 192)  # VOC "void"


def test_known_official_colours():
    citys = get_palette("citys")
    assert citys[0] == (128, 64, 128) and citys[10] == (70, 130, 180) and citys[18] == (119, 11, 32)
    ade = get_palette("ade20k")
    assert ade[0] == (120, 120, 120) and ade[2] == (6, 230, 230) and ade[149] == (92, 0, 255)
    assert ade[6] == ade[48] == (140, 140, 140)  # the official table repeats this colour (road / skyscraper)
    assert get_palette("pascal_voc") == voc_palette()[:21]


@pytest.mark.parametrize("name", PALETTE_NAMES)
def test_every_palette_has_one_colour_per_class_and_a_distinct_ignore_colour(name):
    palette = get_palette(name)
    assert len(palette) == NUM_CLASS[name]
    assert all(len(c) == 3 and all(0 <= v <= 255 for v in c) for c in palette)
    assert get_ignore_color(name) not in palette
    assert get_palette(name.upper()) == palette


def test_shapes_palette_distinct():
    assert len(set(get_palette("shapes"))) == 7 and get_ignore_color("shapes") == (255, 255, 255)


def test_colorize_values_colours_and_ignore():
    mask = np.array([[0, 1, 2], [6, -1, 255]])
    original = mask.copy()
    image = colorize(mask, "shapes")
    assert isinstance(image, Image.Image) and image.mode == "P" and image.size == (3, 2)
    np.testing.assert_array_equal(np.asarray(image), [[0, 1, 2], [6, 255, 255]])
    rgb = np.asarray(image.convert("RGB"))
    palette = get_palette("shapes")
    for (r, c), label in np.ndenumerate(mask):
        expected = get_ignore_color("shapes") if label in (-1, 255) else palette[label]
        assert tuple(rgb[r, c]) == expected
    np.testing.assert_array_equal(mask, original)  # input untouched
    from_tensor = colorize(torch.from_numpy(mask).unsqueeze(0), "shapes")
    np.testing.assert_array_equal(np.asarray(from_tensor), np.asarray(image))


def test_get_mask_pallete_is_colorize():
    mask = np.random.default_rng(0).integers(0, 21, size=(5, 6))
    a, b = get_mask_pallete(mask, "pascal_voc"), colorize(mask, "pascal_voc")
    assert a.getpalette() == b.getpalette()
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("dataset", ["ade20k", "pcontext"])
def test_get_mask_pallete_takes_make_preds_raw_values_as_pytorch_encoding(dataset):
    """PE's test.py hands it ``make_pred``'s raw values (class k as k + 1): the pixel values stay those a submission
    holds, and value k + 1 shows class k's colour (PE's ADE palette: 1 -> wall (120, 120, 120), 150 -> (92, 0,
    255)); 0 ("other") the ignore colour. They were taken as class ids: colours off by one, the last class an error."""
    n = len(get_palette(dataset))
    raw = np.array([[0, 1, 2], [n, n - 1, 0]])
    image = get_mask_pallete(raw, dataset)
    np.testing.assert_array_equal(np.asarray(image), raw)
    rgb = np.asarray(image.convert("RGB"))
    classes = colorize(np.where(raw == 0, -1, raw - 1), dataset).convert("RGB")
    np.testing.assert_array_equal(rgb, np.asarray(classes))
    if dataset == "ade20k":
        assert tuple(rgb[0, 1]) == (120, 120, 120) and tuple(rgb[1, 0]) == (92, 0, 255)
    voc = np.array([[0, 21, 3]])
    assert np.asarray(get_mask_pallete(voc, "pascal_voc")).tolist() == [[0, 255, 3]] and voc[0, 1] == 21


def test_colorize_rejects_bad_input():
    with pytest.raises(ValueError, match=r"\[7, 300\]"):
        colorize(np.array([[0, 7, 300]]), "shapes")
    with pytest.raises(ValueError, match="unknown dataset 'voc2012'"):
        colorize(np.zeros((2, 2), dtype=int), "voc2012")
    with pytest.raises(TypeError, match="integer"):
        colorize(np.full((2, 2), 0.5), "shapes")
    with pytest.raises(ValueError, match="HxW"):
        colorize(np.zeros((2, 2, 2), dtype=int), "shapes")


def test_custom_palette():
    image = colorize(np.array([[0, 1, -1]]), [(10, 20, 30), (0, 0, 0)])
    rgb = np.asarray(image.convert("RGB"))[0]
    assert tuple(rgb[0]) == (10, 20, 30) and tuple(rgb[1]) == (0, 0, 0)
    assert tuple(rgb[2]) not in [(10, 20, 30), (0, 0, 0)]


def test_overlay():
    rng = np.random.default_rng(1)
    image = rng.integers(0, 256, size=(4, 5, 3), dtype=np.uint8)
    mask = rng.integers(0, 7, size=(4, 5))
    mask[0, 0] = -1
    colors = np.asarray(colorize(mask, "shapes").convert("RGB")).astype(float)
    half = np.asarray(overlay(image, mask, "shapes", alpha=0.5)).astype(float)
    expected = np.floor(0.5 * image + 0.5 * colors + 0.5)
    expected[0, 0] = image[0, 0]  # ignored pixels show the image
    np.testing.assert_array_equal(half, expected)
    np.testing.assert_array_equal(np.asarray(overlay(Image.fromarray(image), mask, "shapes", 0.0)), image)
    chw = torch.from_numpy(image).permute(2, 0, 1).float() / 255.0
    np.testing.assert_array_equal(np.asarray(overlay(chw, mask, "shapes", 0.0)), image)
    with pytest.raises(ValueError, match="does not match"):
        overlay(image, mask[:3], "shapes")
    with pytest.raises(ValueError, match="alpha"):
        overlay(image, mask, "shapes", alpha=1.5)


def test_overlay_leaves_the_background_unblended_and_reads_3_pixel_wide_tensors():
    from encoding.inference.evaluation import overlay_with_legend
    from encoding.datasets.shapes import SHAPES_CLASSES
    rng = np.random.default_rng(2)
    image = rng.integers(0, 256, size=(6, 5, 3), dtype=np.uint8)
    mask = rng.integers(0, 3, size=(6, 5))
    mask[0, :] = 0
    kept = np.asarray(overlay(image, mask, "shapes", 0.5, unblended=(0,)))
    np.testing.assert_array_equal(kept[mask == 0], image[mask == 0])
    assert (kept[mask != 0] != image[mask != 0]).any()
    shown = np.asarray(overlay_with_legend(image, mask, "shapes", SHAPES_CLASSES))[:6]
    np.testing.assert_array_equal(shown[mask == 0], image[mask == 0])  # the photo is not darkened
    blended = np.asarray(overlay_with_legend(image, mask, "shapes", SHAPES_CLASSES, blend_background=True))[:6]
    np.testing.assert_array_equal(blended, np.asarray(overlay(image, mask, "shapes", 0.5)))
    narrow = torch.from_numpy(image[:, :3]).permute(2, 0, 1).float() / 255.0  # 3 x 6 x 3: channels first
    np.testing.assert_array_equal(np.asarray(overlay(narrow, mask[:, :3], "shapes", 0.0)), image[:, :3])
