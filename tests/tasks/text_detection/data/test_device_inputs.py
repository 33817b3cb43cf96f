"""Compact loader batches become the float inputs the network and the loss expect."""

from __future__ import annotations

import lightning as L
import numpy as np
import pytest
import torch
from lightning.pytorch.trainer.states import RunningStage

from vramkit.tasks.text_detection.data.datamodule import TextDetectionDataModule
from vramkit.tasks.text_detection.data.device_inputs import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    image_to_tensor,
    normalize_images,
    to_model_inputs,
)


def _compact_batch(side: int = 8) -> dict:
    generator = torch.Generator().manual_seed(0)
    return {
        "image": torch.randint(0, 256, (2, 3, side, side), dtype=torch.uint8, generator=generator),
        "shrink_map": torch.randint(0, 2, (2, side, side), dtype=torch.uint8, generator=generator),
        "shrink_mask": torch.ones(2, side, side, dtype=torch.uint8),
        "thresh_map": torch.full((2, side, side), 0.3),
        "thresh_mask": torch.zeros(2, side, side, dtype=torch.uint8),
        "skipped": 0,
        "name": ["a", "b"],
    }


def test_normalisation_matches_the_per_pixel_float32_formula() -> None:
    image = np.random.default_rng(0).integers(0, 256, (33, 17, 3), dtype=np.uint8)
    mean = np.array(IMAGENET_MEAN, dtype=np.float32)
    std = np.array(IMAGENET_STD, dtype=np.float32)
    expected = (image.astype(np.float32) * np.float32(1 / 255) - mean) / std
    got = normalize_images(image_to_tensor(image)[None])[0]
    assert got.shape == (3, 33, 17) and got.dtype == torch.float32
    np.testing.assert_allclose(got.numpy().transpose(1, 2, 0), expected, rtol=0, atol=1e-6)


def test_image_to_tensor_refuses_what_is_not_a_uint8_rgb_image() -> None:
    with pytest.raises(ValueError, match="uint8"):
        image_to_tensor(np.zeros((4, 4, 3), dtype=np.float32))
    with pytest.raises(ValueError, match=r"\(4, 4\)"):
        image_to_tensor(np.zeros((4, 4), dtype=np.uint8))


def test_model_inputs_are_floats_of_the_same_values() -> None:
    batch = _compact_batch()
    inputs = to_model_inputs(batch)
    assert inputs["image"].dtype == torch.float32
    assert torch.equal(inputs["image"], normalize_images(batch["image"]))
    for key in ("shrink_map", "shrink_mask", "thresh_map", "thresh_mask"):
        assert inputs[key].dtype == torch.float32
        assert torch.equal(inputs[key], batch[key].float()), key
    assert inputs["name"] == ["a", "b"] and inputs["skipped"] == 0
    assert batch["image"].dtype == torch.uint8, "the loader's batch is left as it was"


def test_floating_images_are_taken_as_normalised_and_only_cast() -> None:
    batch = _compact_batch()
    batch["image"] = torch.randn(2, 3, 8, 8)
    inputs = to_model_inputs(batch, torch.bfloat16)
    assert inputs["image"].dtype == torch.bfloat16
    assert torch.equal(inputs["image"], batch["image"].to(torch.bfloat16))
    assert inputs["thresh_map"].dtype == torch.bfloat16


def test_a_batch_of_unreadable_images_passes_through() -> None:
    assert to_model_inputs({"skipped": 3}) == {"skipped": 3}


def test_the_datamodule_makes_inputs_after_the_transfer_as_the_precision_wants(
    tmp_path,
) -> None:
    datamodule = TextDetectionDataModule(
        synthetic={"num_train": 2, "num_val": 1, "image_size": 64}, data_root=str(tmp_path)
    )
    assert datamodule.on_after_batch_transfer(_compact_batch(), 0)["image"].dtype == torch.float32
    trainer = L.Trainer(precision="bf16-true", accelerator="cpu", logger=False)
    datamodule.trainer = trainer  # what fit() does
    inputs = datamodule.on_after_batch_transfer(_compact_batch(), 0)
    assert inputs["image"].dtype == inputs["shrink_map"].dtype == torch.bfloat16


def test_validation_batches_keep_their_maps_as_loaded_and_training_batches_get_floats(
    tmp_path,
) -> None:
    datamodule = TextDetectionDataModule(
        synthetic={"num_train": 2, "num_val": 1, "image_size": 64}, data_root=str(tmp_path)
    )
    trainer = L.Trainer(accelerator="cpu", logger=False)
    datamodule.trainer = trainer
    for stage in (RunningStage.VALIDATING, RunningStage.SANITY_CHECKING):
        trainer.state.stage = stage
        inputs = datamodule.on_after_batch_transfer(_compact_batch(), 0)
        assert inputs["image"].dtype == torch.float32, stage
        assert inputs["shrink_map"].dtype == torch.uint8, stage
        assert torch.equal(inputs["shrink_map"], _compact_batch()["shrink_map"])
    trainer.state.stage = RunningStage.TRAINING
    inputs = datamodule.on_after_batch_transfer(_compact_batch(), 0)
    assert inputs["shrink_map"].dtype == inputs["shrink_mask"].dtype == torch.float32


def test_channels_last_images_hold_the_same_values_laid_out_nhwc() -> None:
    batch = _compact_batch(side=16)
    nchw = to_model_inputs(batch)["image"]
    nhwc = to_model_inputs(batch, channels_last=True)["image"]
    assert nchw.is_contiguous() and not nhwc.is_contiguous()
    assert nhwc.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(nhwc, nchw)


def test_the_datamodule_sends_images_in_the_layout_it_was_given(tmp_path) -> None:
    for channels_last in (False, True):
        datamodule = TextDetectionDataModule(
            synthetic={"num_train": 2, "num_val": 1, "image_size": 64},
            data_root=str(tmp_path),
            channels_last=channels_last,
        )
        image = datamodule.on_after_batch_transfer(_compact_batch(side=16), 0)["image"]
        assert image.is_contiguous(memory_format=torch.channels_last) is channels_last
