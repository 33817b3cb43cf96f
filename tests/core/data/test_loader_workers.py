"""Loader workers keep their freed memory and are seeded as Lightning seeds its own."""

from __future__ import annotations

import platform
from pathlib import Path

import pytest
import torch
from lightning.fabric.utilities.seed import pl_worker_init_function

from vramkit.core.data.loader_workers import init_loader_worker, keep_freed_memory
from vramkit.tasks.text_detection.data.datamodule import TextDetectionDataModule


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_glibc_accepts_the_malloc_settings() -> None:
    assert keep_freed_memory() is True


def test_workers_are_seeded_as_lightning_would_when_asked(monkeypatch) -> None:
    monkeypatch.setenv("PL_SEED_WORKERS", "1")
    torch.manual_seed(123)
    init_loader_worker(1)
    ours = torch.initial_seed()
    torch.manual_seed(123)
    pl_worker_init_function(1)
    assert ours == torch.initial_seed() != 123


def test_workers_keep_torch_seeding_when_lightning_was_not_asked(monkeypatch) -> None:
    monkeypatch.setenv("PL_SEED_WORKERS", "0")
    torch.manual_seed(123)
    init_loader_worker(1)
    assert torch.initial_seed() == 123


def test_only_loaders_with_workers_get_the_init_function(tmp_path: Path) -> None:
    synthetic = {"num_train": 2, "num_val": 2, "image_size": 64}
    for workers, expected in ((1, init_loader_worker), (0, None)):
        module = TextDetectionDataModule(
            synthetic=synthetic,
            data_root=str(tmp_path),
            image_size=64,
            val_image_size=64,
            batch_size=2,
            val_batch_size=2,
            num_workers=workers,
        )
        module.prepare_data()
        module.setup("fit")
        assert module.train_dataloader().worker_init_fn is expected
        assert module.val_dataloader().worker_init_fn is expected
