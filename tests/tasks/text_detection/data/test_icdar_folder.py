"""The ICDAR-folder dataset on the real toy data, on bad input, and its collate function."""

from __future__ import annotations

import shutil
import warnings
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch

from vramkit.core.data.bad_lines import DETAILED_LINES_PER_FILE
from vramkit.tasks.text_detection.data.augment import build_val_transform
from vramkit.tasks.text_detection.data.icdar_folder import (
    DataError,
    DataWarning,
    TextDetectionDataset,
    collate_text_detection,
)
from vramkit.tasks.text_detection.data.icdar_format import AnnotationError, read_ground_truth

MAPS = ("shrink_map", "shrink_mask", "thresh_map", "thresh_mask")


@pytest.fixture
def small_folder(tmp_path: Path, toy_icdar_dir: Path) -> Path:
    """Two real toy images with their ground truth, in a folder the test may spoil."""
    for sub in ("images", "gt"):
        (tmp_path / sub).mkdir()
    for stem in ("img_1", "img_2"):
        shutil.copy(toy_icdar_dir / "images" / f"{stem}.jpg", tmp_path / "images")
        shutil.copy(toy_icdar_dir / "gt" / f"gt_{stem}.txt", tmp_path / "gt")
    return tmp_path


def test_toy_items_at_640(toy_icdar_dir: Path) -> None:
    dataset = TextDetectionDataset(toy_icdar_dir, build_val_transform(640), keep_annotations=True)
    assert len(dataset) == 7
    assert dataset.problems() == {"bad_lines": 0, "missing_gt": 0, "orphan_gt": 0}
    index = [path.stem for path in dataset.image_paths].index("img_1")
    sample = dataset[index]
    assert sample["image"].shape == (3, 640, 640) and sample["image"].dtype == torch.uint8
    rgb = cv2.cvtColor(cv2.imread(str(toy_icdar_dir / "images" / "img_1.jpg")), cv2.COLOR_BGR2RGB)
    expected = cv2.resize(rgb, (640, 640))
    np.testing.assert_array_equal(sample["image"].numpy().transpose(1, 2, 0), expected)
    for key in MAPS:
        dtype = torch.float32 if key == "thresh_map" else torch.uint8
        assert sample[key].shape == (640, 640) and sample[key].dtype == dtype, key
        assert float(sample[key].min()) >= 0.0 and float(sample[key].max()) <= 1.0
    assert float(sample["thresh_map"].min()) >= 0.3 - 1e-6
    assert float(sample["thresh_map"].max()) <= 0.7 + 1e-6
    assert sample["shrink_map"].sum() > 0 and sample["thresh_mask"].sum() > 0
    assert (sample["shrink_mask"] == 0).any(), "img_1 has ### regions to mask out"
    truth = read_ground_truth(toy_icdar_dir / "gt" / "gt_img_1.txt")
    assert sample["name"] == "img_1"
    assert sample["original_size"] == (720, 1280)
    assert sample["ignore"] == truth.ignore
    assert len(sample["polygons"]) == len(truth.polygons)
    for got, want in zip(sample["polygons"], truth.polygons, strict=True):
        assert got.shape == (4, 2) and got.dtype == np.float32
        np.testing.assert_array_equal(got, want)


def test_without_transform_the_text_core_lies_inside_care_polygons(toy_icdar_dir: Path) -> None:
    dataset = TextDetectionDataset(toy_icdar_dir, None, keep_annotations=True)
    sample = dataset[0]
    assert sample["shrink_map"].shape == (720, 1280)
    care = np.zeros((720, 1280), np.uint8)
    for polygon, ignored in zip(sample["polygons"], sample["ignore"], strict=True):
        if not ignored:
            cv2.fillPoly(care, [np.round(polygon).astype(np.int32)], 1)
    text_core = sample["shrink_map"].numpy() > 0
    assert text_core.any()
    assert not np.any(text_core & (care == 0))


def test_a_corrupt_image_is_skipped_with_its_name(small_folder: Path) -> None:
    (small_folder / "images" / "img_0.jpg").write_bytes(b"\xff\xd8 not a jpeg at all" * 10)
    shutil.copy(small_folder / "gt" / "gt_img_1.txt", small_folder / "gt" / "gt_img_0.txt")
    dataset = TextDetectionDataset(small_folder, build_val_transform(64))
    assert [path.stem for path in dataset.image_paths] == ["img_0", "img_1", "img_2"]
    with pytest.warns(DataWarning, match=r"img_0\.jpg: cannot decode"):
        assert dataset[0] is None
    assert dataset[1]["image"].shape == (3, 64, 64)
    strict = TextDetectionDataset(small_folder, build_val_transform(64), strict=True)
    with pytest.raises(DataError, match=r"img_0\.jpg"):
        strict[0]


def test_malformed_and_non_utf8_lines_are_named_and_counted(small_folder: Path) -> None:
    gt = small_folder / "gt" / "gt_img_2.txt"
    good = gt.read_bytes()
    gt.write_bytes(good + b"10,20,30,40,text\n" + b"1,1,9,1,9,9,1,9,caf\xe9\n")
    lines = len(good.decode("utf-8-sig").splitlines())
    with pytest.warns(DataWarning) as caught:
        dataset = TextDetectionDataset(small_folder, build_val_transform(64), keep_annotations=True)
    messages = [str(w.message) for w in caught]
    assert any(f"gt_img_2.txt:{lines + 1}:" in m for m in messages)
    assert any(f"gt_img_2.txt:{lines + 2}:" in m and "UTF-8" in m for m in messages)
    assert dataset.bad_lines == 2
    truth = read_ground_truth(small_folder / "gt" / "gt_img_2.txt")
    assert len(dataset[1]["polygons"]) == len(truth.polygons) > 0  # the good lines are kept
    with pytest.raises(AnnotationError, match=rf"gt_img_2\.txt:{lines + 1}:"):
        TextDetectionDataset(small_folder, None, strict=True)


def test_checked_on_access_an_item_reads_only_its_own_ground_truth(small_folder: Path) -> None:
    gt = small_folder / "gt" / "gt_img_2.txt"
    gt.write_bytes(gt.read_bytes() + b"10,20,30,40,text\n")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing is read at construction
        lazy = TextDetectionDataset(
            small_folder, build_val_transform(64), keep_annotations=True, check_on_access=True
        )
    assert len(lazy) == 2 and lazy.bad_lines == 0
    with pytest.warns(DataWarning):
        eager = TextDetectionDataset(small_folder, build_val_transform(64), keep_annotations=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        first = lazy[0]  # img_1's file is clean: img_2's bad line is not read yet
    want = eager[0]
    assert first.keys() == want.keys() and lazy.bad_lines == 0
    for key, value in want.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(first[key], value), key
    np.testing.assert_array_equal(np.stack(first["polygons"]), np.stack(want["polygons"]))
    assert first["ignore"] == want["ignore"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the eager read of the same file warned already
        lazy[1]
    assert lazy.bad_lines == 1  # read on access, and counted
    assert lazy.problems() == eager.problems()


def test_missing_and_orphan_ground_truth_are_named_and_counted(small_folder: Path) -> None:
    (small_folder / "gt" / "gt_img_2.txt").rename(small_folder / "gt" / "gt_img_9.txt")
    with pytest.warns(DataWarning) as caught:
        dataset = TextDetectionDataset(small_folder, None)
    messages = " ".join(str(w.message) for w in caught)
    assert "img_2.jpg: no ground-truth file" in messages
    assert "gt_img_9.txt: no image" in messages
    assert dataset.problems() == {"bad_lines": 0, "missing_gt": 1, "orphan_gt": 1}
    assert [path.stem for path in dataset.image_paths] == ["img_1"]
    with pytest.raises(DataError, match=r"img_2\.jpg"):
        TextDetectionDataset(small_folder, None, strict=True)


def test_a_folder_without_images_is_an_error_naming_it(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=str(tmp_path / "images")):
        TextDetectionDataset(tmp_path, None)
    (tmp_path / "images").mkdir()
    with pytest.raises(DataError, match="no images"):
        TextDetectionDataset(tmp_path, None)


def test_collate_drops_none_and_counts_it(small_folder: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a clean folder warns about nothing
        dataset = TextDetectionDataset(small_folder, build_val_transform(64), keep_annotations=True)
    batch = collate_text_detection([dataset[0], None, dataset[1], None])
    assert batch["skipped"] == 2
    assert batch["image"].shape == (2, 3, 64, 64)
    for key in MAPS:
        assert batch[key].shape == (2, 64, 64)
    assert batch["name"] == ["img_1", "img_2"]
    assert batch["original_size"] == [(720, 1280), (720, 1280)]
    assert isinstance(batch["polygons"], list) and len(batch["polygons"]) == 2
    assert collate_text_detection([None, None]) == {"skipped": 2}


def test_collate_names_the_key_of_unequal_sizes(small_folder: Path) -> None:
    small = TextDetectionDataset(small_folder, build_val_transform(64))[0]
    large = TextDetectionDataset(small_folder, build_val_transform(96))[0]
    with pytest.raises(ValueError, match="cannot batch 'image'"):
        collate_text_detection([small, large])


def test_a_flooded_file_warns_a_few_lines_and_its_counts_stay_complete(tmp_path, toy_icdar_dir):
    root = tmp_path / "flooded"
    shutil.copytree(toy_icdar_dir, root, ignore=shutil.ignore_patterns("README.md"))
    lines = [f"{-50 - i},1,20,1,20,10,-50,10,word" for i in range(300)]  # partly outside
    with (root / "gt" / "gt_img_1.txt").open("a", encoding="utf-8") as handle:
        handle.write("\n".join([*lines, "12,oops"]) + "\n")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # Python's once-per-location filter hides nothing here
        first = TextDetectionDataset(root, None)
        second = TextDetectionDataset(root, None)  # the validation set of the same folder
    flood = [str(w.message) for w in caught if "gt_img_1.txt" in str(w.message)]
    assert len(flood) == DETAILED_LINES_PER_FILE + 1, flood
    assert "more problems in this file not shown" in flood[-1]
    for dataset in (first, second):
        problems = dataset.problems()
        assert problems["bad_lines"] == 1 and problems["geometry_clipped"] == 300
