"""A run over data with a corrupt image and a malformed line finishes, and says what it skipped."""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

import pytest

from vramkit.core.callbacks.bad_input_report import NoUsableInputError
from vramkit.core.data.bad_lines import AnnotationError
from vramkit.core.run.train import train
from vramkit.tasks.text_detection.data.icdar_folder import DataError


@pytest.fixture
def damaged_icdar_dir(tmp_path: Path, toy_icdar_dir: Path) -> Path:
    """The toy ICDAR set plus a corrupt image and a malformed ground-truth line."""
    root = tmp_path / "damaged"
    shutil.copytree(toy_icdar_dir, root, ignore=shutil.ignore_patterns("README.md"))
    (root / "images" / "img_8.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    (root / "gt" / "gt_img_8.txt").write_text("1,1,20,1,20,10,1,10,word\n", encoding="utf-8")
    with (root / "gt" / "gt_img_1.txt").open("a", encoding="utf-8") as handle:
        handle.write("12,oops,no numbers here\n")
    return root


def _overrides(root: Path) -> list[str]:
    return [
        "+hw=cpu",
        "data=icdar2015",
        f"data.train_dir={root}",
        f"data.val_dir={root}",
        "data.image_size=128",
        "data.val_image_size=128",
        "data.num_workers=0",
        "hw.batch_size=8",  # the whole set, the corrupt image included, in one batch
        "hw.val_batch_size=8",
        "trainer.max_epochs=1",
        "logger=csv",
    ]


@pytest.mark.slow
def test_a_corrupt_image_is_skipped_counted_and_the_run_finishes(compose_config, damaged_icdar_dir):
    cfg = compose_config(*_overrides(damaged_icdar_dir))
    with pytest.warns(UserWarning, match="img_8.jpg") as caught:
        train(cfg)
    messages = [str(w.message) for w in caught]
    assert any("gt_img_1.txt:" in message for message in messages), messages
    (metrics_csv,) = Path(cfg.paths.output_dir).glob("csv/version_*/metrics.csv")
    rows = list(csv.DictReader(metrics_csv.open()))
    skipped = {
        key: float(row[key]) for row in rows for key in row if key.startswith("data/") and row[key]
    }
    assert skipped == {"data/skipped_train_images": 1.0, "data/skipped_val_images": 1.0}


def test_strict_mode_refuses_the_malformed_line_naming_file_and_line(
    compose_config, damaged_icdar_dir
):
    cfg = compose_config(*_overrides(damaged_icdar_dir), "data.strict=true")
    with pytest.raises(AnnotationError, match=r"gt_img_1\.txt:8: "):
        train(cfg)


def test_strict_mode_refuses_the_corrupt_image_naming_it(compose_config, damaged_icdar_dir):
    (damaged_icdar_dir / "gt" / "gt_img_1.txt").write_text(
        "1,1,20,1,20,10,1,10,word\n", encoding="utf-8"
    )
    cfg = compose_config(*_overrides(damaged_icdar_dir), "data.strict=true")
    with pytest.raises(DataError, match=r"img_8\.jpg"):
        train(cfg)


@pytest.mark.slow
def test_a_dataset_with_no_readable_image_is_an_error_not_an_empty_epoch(
    compose_config, damaged_icdar_dir
):
    for image in (damaged_icdar_dir / "images").iterdir():
        image.write_bytes(b"\\xff\\xd8 truncated")
    cfg = compose_config(*_overrides(damaged_icdar_dir), "trainer.num_sanity_val_steps=0")
    with pytest.warns(UserWarning), pytest.raises(NoUsableInputError, match="train epoch 0 had no"):
        train(cfg)
    checkpoints = Path(cfg.paths.output_dir) / "checkpoints"
    assert not list(checkpoints.glob("epoch_*.ckpt")), "no checkpoint of an untrained model"
