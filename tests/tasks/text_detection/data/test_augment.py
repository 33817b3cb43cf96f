"""Augmentations move the polygons with the pixels, keep every point and their order."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from vramkit.tasks.text_detection.data.augment import build_train_transform, build_val_transform


def _rectangle(x0: float, y0: float, x1: float, y1: float) -> np.ndarray:
    return np.array([[x0, y0], [x1, y0], [x1, y1], [x0, y1]], dtype=np.float32)


WORDS = [
    _rectangle(100, 80, 260, 120),
    _rectangle(400, 300, 520, 350),
    _rectangle(150, 500, 330, 560),
    _rectangle(900, 200, 1100, 260),
]


def _dark_words_on_white(height: int = 720, width: int = 1280) -> np.ndarray:
    image = np.full((height, width, 3), 255, np.uint8)
    for polygon in WORDS:
        x0, y0 = polygon[0].astype(int)
        x1, y1 = polygon[2].astype(int)
        image[y0:y1, x0:x1] = 0
    return image


def test_resize_scales_coordinates_exactly() -> None:
    image = np.zeros((720, 1280, 3), np.uint8)
    polygons = [*WORDS, np.array([[-10, -5], [1290, 0], [1280, 730], [0, 720]], np.float32)]
    resized, moved = build_val_transform(640)(image, polygons)
    assert resized.shape == (640, 640, 3)
    assert len(moved) == len(polygons)
    for before, after in zip(polygons, moved, strict=True):
        np.testing.assert_allclose(after, before * np.array([640 / 1280, 640 / 720]), rtol=1e-6)


@pytest.mark.parametrize("seed", range(12))
def test_train_transform_keeps_polygons_on_their_words(seed: int) -> None:
    torch.manual_seed(seed)
    transform = build_train_transform(320, scale=(0.5, 2.0), rotate_limit=10, colour_jitter=False)
    image, moved = transform(_dark_words_on_white(), WORDS, [False] * len(WORDS))
    assert image.shape == (320, 320, 3)
    assert len(moved) == len(WORDS)
    for polygon in moved:
        assert polygon.shape == (4, 2)
        # Order kept: the first point is still the top-left one (rotation is at most 10°).
        assert np.argmin(polygon.sum(axis=1)) == 0 and np.argmax(polygon.sum(axis=1)) == 2
        inside = (polygon >= 3).all() and (polygon <= 316).all()
        if not inside:
            continue
        # Sample points well inside the quad: they must be on the dark word.
        centre = polygon.mean(axis=0)
        for corner in polygon:
            x, y = np.round(centre + 0.6 * (corner - centre)).astype(int)
            assert image[y, x].max() < 60, f"point {(x, y)} of {polygon.tolist()} is not on text"


def test_text_anchored_crops_contain_the_word() -> None:
    image = np.full((720, 1280, 3), 200, np.uint8)
    word = _rectangle(1150, 650, 1200, 670)
    anchored = build_train_transform(
        256, scale=(1.0, 1.0), rotate_limit=0, text_crop_probability=1.0, colour_jitter=False
    )
    uniform = build_train_transform(
        256, scale=(1.0, 1.0), rotate_limit=0, text_crop_probability=0.0, colour_jitter=False
    )
    torch.manual_seed(0)
    hits = {"anchored": 0, "uniform": 0}
    for _ in range(20):
        for name, transform in (("anchored", anchored), ("uniform", uniform)):
            _, (moved,) = transform(image, [word], [False])
            centre = moved.mean(axis=0)
            hits[name] += bool(((centre >= 0) & (centre < 256)).all())
    assert hits["anchored"] == 20
    assert hits["uniform"] <= 3  # a random 256 px crop holds this corner word 1.3% of the time


def test_an_image_smaller_than_the_crop_is_padded_and_keeps_its_polygons() -> None:
    image = np.full((100, 150, 3), 255, np.uint8)
    word = _rectangle(20, 30, 120, 60)
    image[30:60, 20:120] = 0
    transform = build_train_transform(320, scale=(1.0, 1.0), rotate_limit=0, colour_jitter=False)
    out, (moved,) = transform(image, [word], [False])
    assert out.shape == (320, 320, 3)
    assert (out.reshape(-1, 3) == 0).all(axis=1).sum() > 100 * 150  # black padding + the word
    np.testing.assert_allclose(moved[2] - moved[0], [100, 30], atol=1e-3)  # no scaling


def test_same_torch_seed_same_augmentation_other_seed_other() -> None:
    image = _dark_words_on_white()

    def run(seed: int) -> np.ndarray:
        torch.manual_seed(seed)
        _, moved = build_train_transform(320)(image, WORDS, [False] * len(WORDS))
        return np.stack(moved)

    np.testing.assert_array_equal(run(1), run(1))
    assert not np.allclose(run(1), run(2))


class _Augmented(Dataset):
    def __init__(self) -> None:
        self.transform = build_train_transform(160, colour_jitter=False)
        self.image = _dark_words_on_white(360, 640)

    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> np.ndarray:
        _, moved = self.transform(self.image, WORDS[:2], [False, False])
        return np.stack(moved)


def test_loader_workers_do_not_repeat_each_other() -> None:
    loader = DataLoader(_Augmented(), batch_size=None, num_workers=2)
    first_of_worker_0, first_of_worker_1 = list(loader)[:2]  # workers take turns
    assert not np.allclose(first_of_worker_0, first_of_worker_1)
