"""Validation samples through the cache: identical to computed ones, computed once, recomputed
when an entry is damaged or anything they depend on changes; the datamodule's settings."""

from __future__ import annotations

import shutil
import warnings
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
import torch

from vramkit.core.io.disk_cache import ENTRY_SUFFIX, ValidationCache
from vramkit.tasks.text_detection.data import icdar_folder
from vramkit.tasks.text_detection.data.augment import build_val_transform
from vramkit.tasks.text_detection.data.datamodule import TextDetectionDataModule
from vramkit.tasks.text_detection.data.device_inputs import MAP_KEYS
from vramkit.tasks.text_detection.data.icdar_folder import DataWarning, TextDetectionDataset

SIDE = 320  # px


@pytest.fixture
def toy_copy(tmp_path: Path, toy_icdar_dir: Path) -> Path:
    """The toy set in a folder the test may change."""
    folder = tmp_path / "toy"
    shutil.copytree(toy_icdar_dir, folder)
    for path in folder.rglob("*"):
        path.chmod(0o644 if path.is_file() else 0o755)
    return folder


def _dataset(root: Path, cache: ValidationCache | None, side: int = SIDE, **targets) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DataWarning)
        return TextDetectionDataset(
            root,
            build_val_transform(side),
            target_params={"shrink_ratio": 0.4, **targets},
            keep_annotations=True,
            cache=cache,
            cache_params=None if cache is None else {"resize_px": side},
        )


def _assert_same_sample(got: dict, expected: dict) -> None:
    assert set(got) == set(expected)
    dtypes = {"image": torch.uint8, "thresh_map": torch.float32}
    for key in ("image", *MAP_KEYS):
        assert got[key].dtype == expected[key].dtype == dtypes.get(key, torch.uint8), key
        assert torch.equal(got[key], expected[key]), key
        assert got[key].is_contiguous()
    assert got["name"] == expected["name"]
    assert got["original_size"] == expected["original_size"] == (720, 1280)
    assert got["ignore"] == expected["ignore"]
    for mine, theirs in zip(got["polygons"], expected["polygons"], strict=True):
        np.testing.assert_array_equal(mine, theirs)


def test_cached_samples_are_identical_and_computed_once(
    toy_copy: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    computed = _dataset(toy_copy, None)
    expected = [computed[index] for index in range(len(computed))]
    cache = ValidationCache(tmp_path / "cache", max_bytes=2**30)
    cold = _dataset(toy_copy, cache)
    for index, sample in enumerate(expected):
        _assert_same_sample(cold[index], sample)
    assert cache.writes == len(expected) and cache.hits == 0

    def no_work(*args, **kwargs):
        raise AssertionError("a cached sample was computed again")

    monkeypatch.setattr(icdar_folder, "make_targets", no_work)
    monkeypatch.setattr(cv2, "imdecode", no_work)
    warm_cache = ValidationCache(tmp_path / "cache", max_bytes=2**30)  # as a new process would
    warm = _dataset(toy_copy, warm_cache)
    for index, sample in enumerate(expected):
        _assert_same_sample(warm[index], sample)
        warm[index]["shrink_map"].add_(1)  # served tensors are private, writable copies
    assert warm_cache.hits == 2 * len(expected) and warm_cache.misses == 0
    report = warm_cache.report()
    assert report.entries == len(expected)
    # Binary maps are stored as bytes: an entry is well under the float32 size of 19 B/px.
    assert report.size_bytes < len(expected) * SIDE * SIDE * 11


def test_damaged_entry_is_recomputed_not_served(toy_copy: Path, tmp_path: Path) -> None:
    cache = ValidationCache(tmp_path / "cache", max_bytes=2**30)
    dataset = _dataset(toy_copy, cache)
    expected = dataset[0]
    (entry,) = (tmp_path / "cache").glob(f"*{ENTRY_SUFFIX}")
    data = bytearray(entry.read_bytes())
    data[len(data) // 2] ^= 0x01  # one flipped bit, inside the target maps
    entry.write_bytes(bytes(data))
    _assert_same_sample(dataset[0], expected)
    assert cache.rejected == 1
    _assert_same_sample(dataset[0], expected)
    assert cache.rejected == 1 and cache.hits == 1


@pytest.mark.parametrize("change", ["gt_file", "image_file", "resize", "target_params"])
def test_anything_the_sample_depends_on_changes_its_key(
    toy_copy: Path, tmp_path: Path, change: str
) -> None:
    cache = ValidationCache(tmp_path / "cache", max_bytes=2**30)
    first = _dataset(toy_copy, cache)
    for index in range(len(first)):
        first[index]
    side, targets = SIDE, {}
    if change == "gt_file":
        gt = toy_copy / "gt" / "gt_img_1.txt"
        gt.write_text(gt.read_text(encoding="utf-8-sig") + "10,10,60,10,60,40,10,40,new\n")
    elif change == "image_file":
        image = cv2.imread(str(toy_copy / "images" / "img_1.jpg"))
        cv2.imwrite(str(toy_copy / "images" / "img_1.jpg"), 255 - image)
    elif change == "resize":
        side = 288
    else:
        targets = {"min_text_size": 4}
    second = _dataset(toy_copy, cache, side=side, **targets)
    fresh = _dataset(toy_copy, None, side=side, **targets)
    misses = cache.misses
    for index in range(len(second)):
        _assert_same_sample(second[index], fresh[index])
    changed = cache.misses - misses
    assert changed == (1 if change in ("gt_file", "image_file") else len(second))


def _module(tmp_path: Path, toy: Path, **overrides) -> TextDetectionDataModule:
    arguments = {
        "train_dir": str(toy),
        "val_dir": str(toy),
        "image_size": 128,
        "val_image_size": SIDE,
        "batch_size": 4,
        "val_batch_size": 4,
        "num_workers": 0,
        "val_cache": {"enabled": True, "dir": str(tmp_path / "cache"), "max_gib": 1},
        **overrides,
    }
    return TextDetectionDataModule(**arguments)


def test_datamodule_serves_validation_from_the_cache_through_workers(
    toy_copy: Path, tmp_path: Path
) -> None:
    module = _module(tmp_path, toy_copy, num_workers=1, prefetch_factor=3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DataWarning)
        module.setup("validate")
    cv2.setNumThreads(2)
    loader = module.val_dataloader()
    assert cv2.getNumThreads() == 1, "OpenCV's pool must be stopped before workers fork"
    assert loader.prefetch_factor == 3 and loader.persistent_workers
    first = [batch["image"] for batch in loader]
    assert module.val_cache.report().entries == len(list((toy_copy / "images").iterdir()))
    second = [batch["image"] for batch in loader]
    assert all(torch.equal(a, b) for a, b in zip(first, second, strict=True))


def test_datamodule_cache_settings(toy_copy: Path, tmp_path: Path) -> None:
    module = _module(tmp_path, toy_copy)
    assert module.val_cache.max_bytes == 2**30
    assert module.val_cache.directory == tmp_path / "cache"
    off = _module(tmp_path, toy_copy, val_cache={"enabled": False, "dir": "x"})
    assert off.val_cache is None and _module(tmp_path, toy_copy, val_cache=None).val_cache is None
    for setting, message in [
        (
            {"enabled": True, "dir": "x", "max_gi": 1},
            r"data\.val_cache\.max_gi: unknown key; did you mean data\.val_cache\.max_gib\?",
        ),
        ({"enabled": "yes", "dir": "x"}, r"data\.val_cache\.enabled: expected bool, got 'yes'"),
        ({"enabled": True, "dir": ""}, r"data\.val_cache\.dir: expected a non-empty path, got ''"),
        ({"enabled": True}, r"data\.val_cache\.dir: missing: an enabled cache needs a folder"),
        ({"dir": "x", "max_gib": 0}, r"data\.val_cache\.max_gib: must be a positive number"),
        ({"enabled": True, "dir": "x", "max_gib": 1}, None),
    ]:
        if message is None:
            _module(tmp_path, toy_copy, val_cache=setting)
            continue
        with pytest.raises(ValueError, match=message):
            _module(tmp_path, toy_copy, val_cache=setting)
    with pytest.raises(ValueError, match=r"data\.prefetch_factor: must be a positive int or null"):
        _module(tmp_path, toy_copy, prefetch_factor=0)
    with pytest.raises(ValueError, match="cache_params"):
        TextDetectionDataset(toy_copy, None, cache=ValidationCache(tmp_path, max_bytes=1))
