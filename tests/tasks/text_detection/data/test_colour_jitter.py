"""The one-pass colour jitter of the training augmentation."""

from __future__ import annotations

import albumentations as A
import numpy as np
import pytest

from vramkit.tasks.text_detection.data.augment import LinearColourJitter, colour_jitter_matrix

LUMA = np.array([0.299, 0.587, 0.114])


def _apply(matrix: np.ndarray, rgb: np.ndarray) -> np.ndarray:
    return rgb @ matrix[:, :3].T.astype(np.float64) + matrix[:, 3]


def test_neutral_factors_are_the_identity() -> None:
    matrix = colour_jitter_matrix(1.0, 1.0, 1.0, 0.0, mean_luma=123.0)
    np.testing.assert_allclose(matrix, np.hstack([np.eye(3), np.zeros((3, 1))]), atol=1e-6)
    image = np.random.default_rng(0).integers(0, 256, (16, 24, 3), dtype=np.uint8)
    jitter = LinearColourJitter(brightness=0.0, contrast=0.0, saturation=0.0, hue=0.0, p=1.0)
    np.testing.assert_array_equal(jitter(image=image)["image"], image)


def test_each_factor_does_what_its_name_says() -> None:
    colour = np.array([200.0, 80.0, 40.0])
    luma = colour @ LUMA
    brighter = _apply(colour_jitter_matrix(1.2, 1.0, 1.0, 0.0, 100.0), colour)
    np.testing.assert_allclose(brighter, 1.2 * colour, atol=1e-3)
    # Contrast pulls towards (or pushes away from) the image's mean luma.
    flatter = _apply(colour_jitter_matrix(1.0, 0.5, 1.0, 0.0, 100.0), colour)
    np.testing.assert_allclose(flatter, 0.5 * colour + 50.0, atol=1e-3)
    grey = _apply(colour_jitter_matrix(1.0, 1.0, 0.0, 0.0, 100.0), colour)
    np.testing.assert_allclose(grey, np.full(3, luma), atol=1e-3)
    # A hue turn keeps the luma and the chroma's length, and changes the colour.
    turned = _apply(colour_jitter_matrix(1.0, 1.0, 1.0, 0.1, 100.0), colour)
    assert turned @ LUMA == pytest.approx(luma, abs=1e-3)
    assert np.abs(turned - colour).max() > 20
    full_turn = _apply(colour_jitter_matrix(1.0, 1.0, 1.0, 1.0, 100.0), colour)
    np.testing.assert_allclose(full_turn, colour, atol=1e-3)


def test_greys_stay_grey_and_values_saturate() -> None:
    image = np.zeros((4, 4, 3), dtype=np.uint8)
    image[:2] = 250
    image[2:] = 90
    jitter = LinearColourJitter(brightness=0.3, contrast=0.3, saturation=0.3, hue=0.03, p=1.0)
    jitter.set_random_seed(5)
    for _ in range(20):
        out = jitter(image=image)["image"]
        assert out.dtype == np.uint8 and out.shape == image.shape
        spread = out.max(axis=2).astype(int) - out.min(axis=2)
        assert spread.max() <= 1  # rounding only


def test_draws_follow_the_pipeline_seed() -> None:
    image = np.random.default_rng(1).integers(0, 256, (8, 8, 3), dtype=np.uint8)

    def outputs(seed: int) -> list[np.ndarray]:
        pipeline = A.Compose([LinearColourJitter(p=1.0)])
        pipeline.set_random_seed(seed)
        return [pipeline(image=image)["image"] for _ in range(3)]

    first, again, other = outputs(7), outputs(7), outputs(8)
    assert all(np.array_equal(a, b) for a, b in zip(first, again, strict=True))
    assert not np.array_equal(first[0], first[1])
    assert not np.array_equal(first[0], other[0])


def test_out_of_range_settings_are_refused() -> None:
    with pytest.raises(ValueError, match=r"hue must lie in \[0, 0\.5\]"):
        LinearColourJitter(hue=0.7)
    with pytest.raises(ValueError, match="brightness"):
        LinearColourJitter(brightness=-0.1)
