"""A JPEG with an EXIF orientation tag: its pixels and its ground truth stay in one pixel grid."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from vramkit.tasks.text_detection.data.augment import build_val_transform
from vramkit.tasks.text_detection.data.icdar_folder import (
    EXIF_ORIENTATION_TAG,
    DataWarning,
    TextDetectionDataset,
    image_header,
)

HEIGHT, WIDTH = 64, 160  # stored px: a landscape image, so a 90° turn changes its shape
TEXT_ROWS, TEXT_COLUMNS = slice(16, 48), slice(24, 136)  # the white "word", in stored px


def _write_tagged_folder(root: Path, orientation: int) -> Path:
    """A one-image ICDAR folder: black, one white word, a polygon on it in stored px."""
    (root / "images").mkdir(parents=True)
    (root / "gt").mkdir()
    pixels = np.zeros((HEIGHT, WIDTH, 3), np.uint8)
    pixels[TEXT_ROWS, TEXT_COLUMNS] = 255
    image = Image.fromarray(pixels)
    exif = image.getexif()
    exif[EXIF_ORIENTATION_TAG] = orientation
    path = root / "images" / "img_1.jpg"
    image.save(path, "JPEG", quality=95, exif=exif.tobytes())
    x0, x1 = TEXT_COLUMNS.start, TEXT_COLUMNS.stop - 1
    y0, y1 = TEXT_ROWS.start, TEXT_ROWS.stop - 1
    (root / "gt" / "gt_img_1.txt").write_text(f"{x0},{y0},{x1},{y0},{x1},{y1},{x0},{y1},WORD\n")
    return path


def test_the_header_reads_the_stored_size_and_the_tag(tmp_path: Path) -> None:
    path = _write_tagged_folder(tmp_path, orientation=6)
    header = image_header(path)
    assert header is not None
    assert (header.height, header.width, header.orientation) == (HEIGHT, WIDTH, 6)


def test_the_polygon_lands_on_the_text_pixels_of_a_rotated_jpeg(tmp_path: Path) -> None:
    path = _write_tagged_folder(tmp_path, orientation=6)  # "rotate 90° clockwise" to display
    with pytest.warns(DataWarning) as caught:
        dataset = TextDetectionDataset(tmp_path, None, keep_annotations=True)
        sample = dataset[0]
        dataset[0]  # read again: the file is named once
    rotated = [str(w.message) for w in caught if "EXIF orientation" in str(w.message)]
    assert len(rotated) == 1
    assert rotated[0].startswith(f"{path}: EXIF orientation 6 (rotate 90° clockwise) ignored")
    assert dataset.problems()["exif_orientation_ignored"] == 1
    image = sample["image"].numpy().transpose(1, 2, 0)
    assert image.shape == (HEIGHT, WIDTH, 3)
    assert sample["original_size"] == (HEIGHT, WIDTH)
    text_core = sample["shrink_map"].numpy() > 0
    assert text_core.sum() > 1000  # the word's shrunk core, not an empty map
    brightness = image.mean(axis=2)
    assert brightness[text_core].min() > 200  # every target pixel is on the white word
    assert sample["shrink_mask"].numpy()[text_core].all()  # and the word is a care word


def test_a_resized_rotated_jpeg_keeps_its_targets_on_the_word(tmp_path: Path) -> None:
    _write_tagged_folder(tmp_path, orientation=8)
    with pytest.warns(DataWarning, match="EXIF orientation 8"):
        sample = TextDetectionDataset(tmp_path, build_val_transform(96))[0]
    brightness = sample["image"].numpy().mean(axis=0)
    text_core = sample["shrink_map"].numpy() > 0
    assert text_core.any() and brightness[text_core].min() > 200


def test_an_untagged_jpeg_warns_about_nothing(tmp_path: Path) -> None:
    _write_tagged_folder(tmp_path, orientation=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dataset = TextDetectionDataset(tmp_path, None)
        dataset[0]
    assert "exif_orientation_ignored" not in dataset.problems()
