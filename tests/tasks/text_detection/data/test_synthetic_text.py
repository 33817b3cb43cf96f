"""The synthetic dataset: determinism, reuse, regeneration, interrupted runs, tight boxes."""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest
import shapely

from vramkit.tasks.text_detection.data import synthetic_text, text_renderer
from vramkit.tasks.text_detection.data.icdar_format import DONT_CARE, read_ground_truth
from vramkit.tasks.text_detection.data.synthetic_text import (
    SyntheticTextConfig,
    ensure_synthetic_dataset,
    image_rng,
    synthetic_dataset_dir,
)
from vramkit.tasks.text_detection.data.text_renderer import TextRenderer, luminance

REPO_ROOT = Path(__file__).resolve().parents[4]
TINY = SyntheticTextConfig(num_train=4, num_val=2, image_size=128)


def _files(dataset_dir: Path) -> dict[str, bytes]:
    return {
        str(path.relative_to(dataset_dir)): path.read_bytes()
        for path in sorted(dataset_dir.rglob("*"))
        if path.is_file() and path.name != "manifest.json"
    }


def _refuse_to_render(*args, **kwargs):
    raise AssertionError("the dataset was rendered again")


def test_same_seed_gives_byte_identical_files_in_two_roots(tmp_path: Path) -> None:
    first = ensure_synthetic_dataset(tmp_path / "a", TINY)
    second = ensure_synthetic_dataset(tmp_path / "b", TINY)
    assert first.name == second.name
    files = _files(first)
    assert sum(name.startswith("train/gt/") for name in files) == 4
    assert sum(name.startswith("val/images/") for name in files) == 2
    assert files == _files(second)
    words = sum(len(read_ground_truth(p).polygons) for p in first.glob("*/gt/*.txt"))
    assert words > 0


def test_another_seed_gives_another_folder_and_other_words(tmp_path: Path) -> None:
    first = ensure_synthetic_dataset(tmp_path, TINY)
    other = ensure_synthetic_dataset(tmp_path, SyntheticTextConfig(**{**TINY.params(), "seed": 1}))
    assert other != first
    gt_name = "train/gt/gt_img_00001.txt"
    assert (first / gt_name).read_bytes() != (other / gt_name).read_bytes()


def test_unchanged_params_reuse_the_dataset_untouched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dataset_dir = ensure_synthetic_dataset(tmp_path, TINY)
    manifest = (dataset_dir / "manifest.json").read_bytes()
    stamp = (dataset_dir / "train" / "gt" / "gt_img_00001.txt").stat().st_mtime_ns
    monkeypatch.setattr(synthetic_text, "write_images", _refuse_to_render)
    assert ensure_synthetic_dataset(tmp_path, TINY) == dataset_dir
    assert (dataset_dir / "manifest.json").read_bytes() == manifest
    assert (dataset_dir / "train" / "gt" / "gt_img_00001.txt").stat().st_mtime_ns == stamp


def test_changed_params_are_rendered_into_a_new_folder(tmp_path: Path) -> None:
    first = ensure_synthetic_dataset(tmp_path, TINY)
    changed = SyntheticTextConfig(**{**TINY.params(), "num_train": 5})
    second = ensure_synthetic_dataset(tmp_path, changed)
    assert second != first and first.is_dir()
    manifest = json.loads((second / "manifest.json").read_text())
    assert manifest["params"]["num_train"] == 5
    assert manifest["hash"] == changed.params_hash()
    assert manifest["counts"]["train"]["images"] == 5
    assert len(list((second / "train" / "images").glob("*.jpg"))) == 5


def _dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def test_an_abandoned_partial_generation_is_not_taken_for_a_dataset(tmp_path: Path) -> None:
    final = synthetic_dataset_dir(tmp_path, TINY)
    abandoned = tmp_path / f".{final.name}.tmp-{socket.gethostname()}-{_dead_pid()}"
    (abandoned / "train" / "images").mkdir(parents=True)
    (abandoned / "train" / "images" / "img_00001.jpg").write_bytes(b"partial")
    assert not synthetic_text.is_complete(abandoned, TINY)
    dataset_dir = ensure_synthetic_dataset(tmp_path, TINY)
    assert dataset_dir == final
    assert synthetic_text.is_complete(final, TINY)
    assert not abandoned.exists()


def test_a_final_folder_with_files_missing_is_rendered_again(tmp_path: Path) -> None:
    dataset_dir = ensure_synthetic_dataset(tmp_path, TINY)
    (dataset_dir / "val" / "gt" / "gt_img_00002.txt").unlink()
    assert not synthetic_text.is_complete(dataset_dir, TINY)
    assert ensure_synthetic_dataset(tmp_path, TINY) == dataset_dir
    assert (dataset_dir / "val" / "gt" / "gt_img_00002.txt").is_file()


def test_an_edited_or_truncated_file_is_named_and_rendered_again_alone(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    dataset_dir = ensure_synthetic_dataset(tmp_path, TINY)
    gt = dataset_dir / "train" / "gt" / "gt_img_00001.txt"
    image = dataset_dir / "val" / "images" / "img_00002.jpg"
    untouched = dataset_dir / "train" / "images" / "img_00002.jpg"
    originals = gt.read_bytes(), image.read_bytes()
    stamp = untouched.stat().st_mtime_ns
    gt.write_text(gt.read_text().replace("1", "7"))  # the same count of files, edited
    image.write_bytes(originals[1][: len(originals[1]) // 2])  # truncated
    assert synthetic_text.damaged_files(dataset_dir, TINY) == [
        "train/gt/gt_img_00001.txt",
        "val/images/img_00002.jpg",
    ]
    with caplog.at_level("WARNING"):
        assert ensure_synthetic_dataset(tmp_path, TINY) == dataset_dir
    assert "train/gt/gt_img_00001.txt" in caplog.text and "rendering them again" in caplog.text
    assert (gt.read_bytes(), image.read_bytes()) == originals
    assert untouched.stat().st_mtime_ns == stamp
    assert synthetic_text.is_complete(dataset_dir, TINY)


def test_without_checksums_only_missing_files_count_as_damaged(tmp_path: Path) -> None:
    dataset_dir = ensure_synthetic_dataset(tmp_path, TINY)
    edited = dataset_dir / "train" / "gt" / "gt_img_00001.txt"
    edited.write_text(edited.read_text().replace("1", "7"))
    (dataset_dir / "val" / "gt" / "gt_img_00002.txt").unlink()
    assert synthetic_text.damaged_files(dataset_dir, TINY, checksums=False) == [
        "val/gt/gt_img_00002.txt"
    ]
    assert synthetic_text.damaged_files(dataset_dir, TINY) == [
        "train/gt/gt_img_00001.txt",
        "val/gt/gt_img_00002.txt",
    ]


def test_a_generation_that_fails_midway_leaves_no_dataset(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = synthetic_text.write_images
    calls = []

    def fail_on_the_second_split(*args, **kwargs):
        calls.append(args[2])
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(synthetic_text, "write_images", fail_on_the_second_split)
    with pytest.raises(KeyboardInterrupt):
        ensure_synthetic_dataset(tmp_path, TINY, workers=1)
    assert list(tmp_path.iterdir()) == []
    monkeypatch.setattr(synthetic_text, "write_images", real)
    assert synthetic_text.is_complete(ensure_synthetic_dataset(tmp_path, TINY), TINY)


def test_parallel_generation_writes_the_same_bytes(tmp_path: Path) -> None:
    serial = ensure_synthetic_dataset(tmp_path / "serial", TINY, workers=1)
    parallel = ensure_synthetic_dataset(tmp_path / "parallel", TINY, workers=2)
    assert _files(serial) == _files(parallel)
    assert json.loads((parallel / "manifest.json").read_text())["generation_processes"] == 2


def test_config_errors_name_the_key() -> None:
    with pytest.raises(ValueError, match=r"data\.synthetic\.num_train: must be ≥ 1, got 0"):
        SyntheticTextConfig.from_config({"num_train": 0}, key_prefix="data.synthetic.")
    with pytest.raises(ValueError, match=r"data\.synthetic\.font_sise: unknown key"):
        SyntheticTextConfig.from_config({"font_sise": [14, 20]}, key_prefix="data.synthetic.")
    with pytest.raises(ValueError, match=r"font_size: expected \[low, high\] with low <= high"):
        SyntheticTextConfig.from_config({"font_size": [30, 20]}, key_prefix="data.synthetic.")
    with pytest.raises(ValueError, match=r"font_size: every value must be ≥ 6, got \[4, 20\]"):
        SyntheticTextConfig.from_config({"font_size": [4, 20]}, key_prefix="data.synthetic.")
    assert SyntheticTextConfig.from_config(
        {"font_size": [14, 20]}, key_prefix="data.synthetic."
    ).font_size == (14, 20)
    as_int, as_float = SyntheticTextConfig(perspective=0), SyntheticTextConfig(perspective=0.0)
    assert as_int.params_hash() == as_float.params_hash()


def _plain_scene(monkeypatch: pytest.MonkeyPatch, config: SyntheticTextConfig, index: int):
    """A scene on a flat grey background, without clutter or sign plates."""
    monkeypatch.setattr(
        text_renderer,
        "_random_background",
        lambda rng, size: np.full((size, size, 3), 128.0, np.float32),
    )
    monkeypatch.setattr(text_renderer, "_draw_clutter", lambda rng, image, max_shapes: None)
    monkeypatch.setattr(TextRenderer, "_draw_plate", staticmethod(lambda *args: None))
    return TextRenderer().render(image_rng(config.seed, "train", index), config)


@pytest.mark.parametrize("index", range(4))
def test_boxes_are_tight_around_the_ink(monkeypatch: pytest.MonkeyPatch, index: int) -> None:
    config = SyntheticTextConfig(
        image_size=256, max_rotation_deg=0.0, perspective=0.0, dont_care_probability=0.0
    )
    scene = _plain_scene(monkeypatch, config, index)
    assert scene.polygons
    difference = np.abs(luminance(scene.image.astype(np.float32)) - 128)
    ink = difference > 50  # well above the noise (sigma <= 6)
    covered = np.zeros(ink.shape, np.uint8)
    for polygon in scene.polygons:
        cv2.fillPoly(covered, [np.round(polygon).astype(np.int32)], 1)
    covered = cv2.dilate(covered, np.ones((5, 5), np.uint8))
    assert not np.any(ink & (covered == 0)), "ink outside every box"
    for polygon in scene.polygons:
        x0, y0 = polygon.min(axis=0)
        x1, y1 = polygon.max(axis=0)
        # Faint ink too: the dot of an i in a thin, blurred font barely passes 50.
        window = difference[int(y0) - 2 : int(y1) + 3, int(x0) - 2 : int(x1) + 3]
        rows, cols = np.nonzero(window > 30)
        # Ink extremes (pixel centres, blur adds a pixel) meet every side of the box.
        assert abs(cols.min() + int(x0) - 2 - x0) <= 2.5
        assert abs(cols.max() + int(x0) - 2 - x1) <= 2.5
        assert abs(rows.min() + int(y0) - 2 - y0) <= 2.5
        assert abs(rows.max() + int(y0) - 2 - y1) <= 2.5


def test_polygons_are_clockwise_inside_the_image_and_disjoint() -> None:
    renderer = TextRenderer()
    config = SyntheticTextConfig()
    for index in range(6):
        scene = renderer.render(image_rng(0, "val", index), config)
        assert scene.image.shape == (320, 320, 3) and scene.image.dtype == np.uint8
        shapes = []
        for polygon, text in zip(scene.polygons, scene.texts, strict=True):
            assert polygon.shape == (4, 2)
            assert np.all((polygon >= 0) & (polygon <= 320))
            # Clockwise on screen (y down) is a positive shoelace sum.
            x, y = polygon[:, 0], polygon[:, 1]
            assert np.sum(x * np.roll(y, -1) - np.roll(x, -1) * y) > 0
            assert polygon[0].sum() <= polygon[2].sum(), "first point is the top-left corner"
            height = min(
                np.linalg.norm(polygon[2] - polygon[1]), np.linalg.norm(polygon[0] - polygon[3])
            )
            if height < config.min_word_height:
                assert text == DONT_CARE
            shapes.append(shapely.Polygon(polygon))
        for i, first in enumerate(shapes):
            for second in shapes[i + 1 :]:
                assert first.intersection(second).area < 1e-6


def test_lines_too_wide_for_the_image_are_split_not_lost() -> None:
    config = SyntheticTextConfig(
        image_size=96,
        font_size=(16, 16),
        words_per_image=(4, 4),
        line_probability=1.0,
        dont_care_probability=0.0,
    )
    renderer = TextRenderer()
    for index in range(5):
        # One planned line of four words, some 250 px wide at 16 px: it must be broken up.
        scene = renderer.render(image_rng(0, "train", index), config)
        assert len(scene.polygons) >= 2


def test_script_writes_the_dataset(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = importlib.util.spec_from_file_location(
        "make_synthetic_text", REPO_ROOT / "scripts" / "make_synthetic_text.py"
    )
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    args = ["--root", str(tmp_path), "--num-train", "3", "--num-val", "1", "--image-size", "64"]
    dataset_dir = script.main([*args, "--workers", "1"])
    assert len(list((dataset_dir / "train" / "images").glob("*.jpg"))) == 3
    assert str(dataset_dir) in capsys.readouterr().out
    assert dataset_dir == synthetic_dataset_dir(
        tmp_path, SyntheticTextConfig(num_train=3, num_val=1, image_size=64)
    )
    assert os.listdir(tmp_path) == [dataset_dir.name]
