"""The text-detection DataModule: batches, idempotent setup, argument errors, problem counts."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf

from vramkit.core.config.schema import ConfigError
from vramkit.tasks.text_detection.data import synthetic_text
from vramkit.tasks.text_detection.data.datamodule import TextDetectionDataModule

TINY_SYNTHETIC = {"num_train": 4, "num_val": 2, "image_size": 128}
MAPS = ("shrink_map", "shrink_mask", "thresh_map", "thresh_mask")


def _module(data_root: Path, **overrides) -> TextDetectionDataModule:
    arguments = {
        "synthetic": TINY_SYNTHETIC,
        "data_root": str(data_root),
        "image_size": 128,
        "val_image_size": 96,
        "batch_size": 2,
        "val_batch_size": 2,
        "num_workers": 0,
        "pin_memory": False,
        **overrides,
    }
    return TextDetectionDataModule(**arguments)


def test_batches_of_a_tiny_synthetic_set(tmp_path: Path) -> None:
    module = _module(tmp_path)
    module.prepare_data()
    module.setup("fit")
    train = next(iter(module.train_dataloader()))
    assert train["image"].shape == (2, 3, 128, 128) and train["image"].dtype == torch.uint8
    for key in MAPS:
        assert train[key].shape == (2, 128, 128)
    assert train["skipped"] == 0 and "polygons" not in train
    assert len(module.train_dataloader()) == 2
    val_batches = list(module.val_dataloader())
    assert len(val_batches) == 1
    val = val_batches[0]
    assert val["image"].shape == (2, 3, 96, 96)
    assert val["name"] == ["img_00001", "img_00002"]  # in order, not shuffled
    assert val["original_size"] == [(128, 128), (128, 128)]
    assert all(p.shape == (4, 2) for polygons in val["polygons"] for p in polygons)
    assert [len(flags) for flags in val["ignore"]] == [len(p) for p in val["polygons"]]
    assert module.train_dataloader().persistent_workers is False


def test_prepare_and_setup_twice_do_no_work_twice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = _module(tmp_path)
    module.prepare_data()
    module.setup("fit")
    datasets = (module.train_dataset, module.val_dataset)

    def refuse(*args, **kwargs):
        raise AssertionError("rendered again")

    monkeypatch.setattr(synthetic_text, "write_images", refuse)
    module.prepare_data()
    module.setup("fit")
    module.setup("validate")
    assert (module.train_dataset, module.val_dataset) == datasets
    # A second module with the same parameters (another process, say) finds the data on disk.
    again = _module(tmp_path)
    again.prepare_data()
    again.setup("fit")
    assert again.train_dataset.image_paths == module.train_dataset.image_paths


def test_set_up_for_planning_the_splits_are_whole_and_checked_later(
    tmp_path: Path, toy_icdar_dir: Path
) -> None:
    val_dir = tmp_path / "val"
    shutil.copytree(toy_icdar_dir, val_dir)
    gt = val_dir / "gt" / "gt_img_3.txt"
    gt.chmod(0o644)
    gt.write_text(gt.read_text(encoding="utf-8-sig") + "1,2,three\n", encoding="utf-8")
    module = _module(tmp_path, synthetic=None, train_dir=str(toy_icdar_dir), val_dir=str(val_dir))
    module.setup_for_planning()
    assert len(module.train_dataset) == len(module.val_dataset) == 7
    assert module.data_problems()["val/bad_lines"] == 0  # no file read yet
    assert next(iter(module.val_dataloader()))["image"].shape == (2, 3, 96, 96)
    with pytest.warns(UserWarning, match=r"gt_img_3\.txt:\d+:"):
        module.setup("fit")  # a run checks every file, whatever the planner read
    assert module.data_problems()["val/bad_lines"] == 1


def test_a_plan_renders_missing_data_and_leaves_checksums_to_the_run(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    first = _module(tmp_path)
    first.prepare_data()
    edited = first.train_dir / "gt" / "gt_img_00001.txt"
    original = edited.read_bytes()
    edited.write_bytes(original.replace(b"1", b"7"))
    (first.val_dir / "gt" / "gt_img_00002.txt").unlink()
    module = _module(tmp_path)
    with caplog.at_level("WARNING"):
        module.setup_for_planning()
    assert "val/gt/gt_img_00002.txt" in caplog.text  # missing: rendered again for the plan
    assert "train/gt" not in caplog.text and edited.read_bytes() != original
    assert len(module.train_dataset) == 4 and len(module.val_dataset) == 2
    caplog.clear()
    with caplog.at_level("WARNING"):
        module.prepare_data()  # the run checks every file: the edit is found and repaired
    assert "train/gt/gt_img_00001.txt" in caplog.text
    assert edited.read_bytes() == original


def test_hydra_containers_are_accepted(tmp_path: Path) -> None:
    config = OmegaConf.create(
        {"synthetic": {**TINY_SYNTHETIC, "font_size": [14, 30]}, "augment": {"scale": [0.7, 1.5]}}
    )
    module = _module(tmp_path, synthetic=config.synthetic, augment=config.augment)
    assert module.settings.synthetic.font_size == (14, 30)
    assert module.train_transform.pipeline.transforms[0].scale == (0.7, 1.5)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"batch_size": 0}, "data.batch_size: must be a positive int, got 0"),
        ({"val_batch_size": "8"}, "data.val_batch_size: expected int, got '8' (str)"),
        ({"image_size": 100}, "data.image_size: must be a positive int, a multiple of 32, got 100"),
        ({"val_image_size": -32}, "data.val_image_size: must be a positive int, a multiple of 32"),
        ({"num_workers": -1}, "data.num_workers: must be ≥ 0, got -1"),
        ({"num_workers": True}, "data.num_workers: expected int, got True (bool)"),
        ({"pin_memory": "yes"}, "data.pin_memory: expected bool, got 'yes' (str)"),
        ({"synthetic": {"num_val": 0}}, "data.synthetic.num_val: must be ≥ 1, got 0"),
        ({"synthetic": {"colour": 1}}, "data.synthetic.colour: unknown key"),
        (
            {"synthetic": {"font_sise": [14, 20]}},
            "data.synthetic.font_sise: unknown key; did you mean data.synthetic.font_size?",
        ),
        ({"augment": {"flip": True}}, "data.augment.flip is not an option of build_train_tr"),
        ({"augment": {"scale": [2.0, 1.0]}}, "data.augment: scale must be a range"),
        ({"targets": {"shrink": 0.4}}, "data.targets.shrink is not an option of make_targets"),
        ({"train_dir": "x"}, "data.train_dir: must be null when data.synthetic is set"),
        ({"synthetic": None, "val_dir": "/nonexistent"}, "data.train_dir: missing"),
    ],
)
def test_bad_arguments_are_errors_naming_the_key(
    tmp_path: Path, overrides: dict, message: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        _module(tmp_path, **overrides)


def test_every_bad_setting_is_reported_at_once_naming_the_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(HydraConfig.instance(), "cfg", None)  # outside a Hydra run
    with pytest.raises(ConfigError) as caught:
        _module(tmp_path, batch_size=0, pin_memory="yes", synthetic={"num_val": 0})
    lines = str(caught.value).splitlines()
    # Built outside a Hydra run, the config has no file to name.
    assert lines[0] == "invalid data settings (the data config):"
    assert caught.value.keys == ("batch_size", "pin_memory", "synthetic.num_val")


def test_a_missing_folder_is_named(tmp_path: Path, toy_icdar_dir: Path) -> None:
    with pytest.raises(ValueError, match=rf"data\.val_dir: does not exist.*{tmp_path / 'nope'}"):
        _module(
            tmp_path, synthetic=None, train_dir=str(toy_icdar_dir), val_dir=str(tmp_path / "nope")
        )


def test_folder_data_and_problem_counts(tmp_path: Path, toy_icdar_dir: Path) -> None:
    val_dir = tmp_path / "val"
    shutil.copytree(toy_icdar_dir, val_dir)
    gt = val_dir / "gt" / "gt_img_3.txt"
    gt.chmod(0o644)
    gt.write_text(gt.read_text(encoding="utf-8-sig") + "1,2,three\n", encoding="utf-8")
    module = _module(
        tmp_path,
        synthetic=None,
        train_dir=str(toy_icdar_dir),
        val_dir=str(val_dir),
        image_size=256,
        val_image_size=320,
        targets={"min_text_size": 4},
    )
    assert module.data_problems() == {}
    with pytest.warns(UserWarning, match=r"gt_img_3\.txt:\d+:"):
        module.setup("fit")
    problems = module.data_problems()
    assert problems["val/bad_lines"] == 1
    assert problems["train/bad_lines"] == 0 and problems["val/missing_gt"] == 0
    assert module.train_dataset.target_params == {"min_text_size": 4}
    batch = next(iter(module.train_dataloader()))
    assert batch["image"].shape == (2, 3, 256, 256)
    batch = next(iter(module.val_dataloader()))
    assert batch["image"].shape == (2, 3, 320, 320)
    assert batch["original_size"][0] == (720, 1280)
