"""CheckpointRetention keeps exactly what it promises: newest periodic, best, last, resumed-from."""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from vramkit.core.callbacks.checkpoints import checkpoint_retention as cr
from vramkit.core.callbacks.checkpoints.checkpoint_retention import CheckpointRetention
from vramkit.core.callbacks.checkpoints.resume_checkpoint import ResumeCheckpoint
from vramkit.core.io.checkpoint_io import AtomicCheckpointIO

MIB = 2**20


class _ScoreFallsEachEpoch(L.LightningModule):
    """``val/score`` = −epoch, so the best checkpoint is the oldest one (epoch 0)."""

    def __init__(self, width: int = 8) -> None:
        super().__init__()
        self.net = nn.Linear(width, width, bias=False)
        self.width = width

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        return self.net(batch[0]).pow(2).mean()

    def validation_step(self, batch: list[torch.Tensor], batch_idx: int) -> None:
        self.log("val/score", -float(self.current_epoch), batch_size=len(batch[0]))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)  # no optimizer state: fixed size

    def _loader(self) -> DataLoader:
        return DataLoader(TensorDataset(torch.randn(4, self.width)), batch_size=2)

    def train_dataloader(self) -> DataLoader:
        return self._loader()

    def val_dataloader(self) -> DataLoader:
        return self._loader()


def _model_checkpoints(folder: Path, latest_as_last: bool) -> list[ModelCheckpoint]:
    """The best checkpoint by val/score, and last.ckpt.

    ``latest_as_last``: last.ckpt of every epoch from a second, unmonitored ModelCheckpoint
    (under Lightning 2.6 ``save_last=True`` rewrites last.ckpt only when a top-k file is saved).
    """
    best = ModelCheckpoint(
        dirpath=folder,
        filename="epoch_{epoch:03d}",
        monitor="val/score",
        mode="max",
        save_top_k=1,
        save_last=not latest_as_last,
        auto_insert_metric_name=False,
    )
    if not latest_as_last:
        return [best]
    latest = ModelCheckpoint(
        dirpath=folder, filename="last", monitor=None, save_top_k=1, enable_version_counter=False
    )
    return [best, latest]


def _fit(
    folder: Path,
    retention: CheckpointRetention,
    max_epochs: int,
    ckpt_path: Path | None = None,
    width: int = 8,
    latest_as_last: bool = True,
) -> L.Trainer:
    trainer = _trainer(folder, max_epochs, [retention, *_model_checkpoints(folder, latest_as_last)])
    trainer.fit(_ScoreFallsEachEpoch(width), ckpt_path=ckpt_path)
    return trainer


def _trainer(folder: Path, max_epochs: int, callbacks: list[L.Callback]) -> L.Trainer:
    return L.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=max_epochs,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        callbacks=callbacks,
        plugins=[AtomicCheckpointIO()],
        default_root_dir=folder.parent,
    )


def _names(folder: Path) -> set[str]:
    return {p.name for p in folder.iterdir()}


def test_twelve_epochs_keep_the_newest_three_periodic_plus_best_and_last(tmp_path):
    folder = tmp_path / "checkpoints"
    report_path = tmp_path / "checkpoint_storage.json"
    retention = CheckpointRetention(every_n_epochs=2, keep_last=3, report_path=report_path)
    _fit(folder, retention, max_epochs=12)
    assert _names(folder) == {
        "epoch_000.ckpt",  # best (the oldest file: age alone would have deleted it)
        "last.ckpt",
        "periodic_epoch_007.ckpt",
        "periodic_epoch_009.ckpt",
        "periodic_epoch_011.ckpt",
    }
    report = json.loads(report_path.read_text())
    roles = {entry["name"]: entry["role"] for entry in report["files"]}
    assert roles["epoch_000.ckpt"] == "best" and roles["last.ckpt"] == "last"
    assert [p["name"] for p in report["pruned"]] == [
        "periodic_epoch_001.ckpt",
        "periodic_epoch_003.ckpt",
        "periodic_epoch_005.ckpt",
    ]
    assert all("newest 3 periodic" in p["reason"] for p in report["pruned"])
    assert torch.load(folder / "periodic_epoch_011.ckpt", weights_only=True)["epoch"] == 11
    assert torch.load(folder / "last.ckpt", weights_only=True)["epoch"] == 11


def test_a_run_resumed_from_a_middle_checkpoint_keeps_the_file_it_resumed_from(tmp_path):
    folder = tmp_path / "checkpoints"
    _fit(folder, CheckpointRetention(every_n_epochs=2, keep_last=3), max_epochs=6)
    middle = folder / "periodic_epoch_001.ckpt"
    assert middle.is_file()

    trainer = _fit(
        folder, CheckpointRetention(every_n_epochs=2, keep_last=3), max_epochs=12, ckpt_path=middle
    )
    assert trainer.current_epoch == 12
    assert _names(folder) == {
        "epoch_000.ckpt",
        "last.ckpt",
        "periodic_epoch_001.ckpt",  # resumed from: never deleted, kept beside the newest three
        "periodic_epoch_007.ckpt",
        "periodic_epoch_009.ckpt",
        "periodic_epoch_011.ckpt",
    }
    last = torch.load(folder / "last.ckpt", weights_only=True)
    # epochs 2..11 ran once on top of epoch 1's state: 12 epochs of 2 steps in all
    assert (last["epoch"], last["global_step"]) == (11, 24)


def test_the_disk_budget_prunes_the_oldest_periodic_checkpoints_first(tmp_path):
    folder = tmp_path / "checkpoints"
    # a 512×512 fp32 weight: every checkpoint is 1 MiB plus a few KiB
    retention = CheckpointRetention(every_n_epochs=1, keep_last=100, budget_gib=4.5 * MIB / 2**30)
    # one ModelCheckpoint with save_last=True: its last_model_path is protected as well
    _fit(folder, retention, max_epochs=8, width=512, latest_as_last=False)
    assert _names(folder) == {
        "epoch_000.ckpt",
        "last.ckpt",
        "periodic_epoch_006.ckpt",
        "periodic_epoch_007.ckpt",
    }
    assert sum(p.stat().st_size for p in folder.iterdir()) <= 4.5 * MIB
    pruned = [p.name for p in retention.pruned]
    assert pruned == [f"periodic_epoch_{epoch:03d}.ckpt" for epoch in range(6)]
    assert all("budget" in p.reason for p in retention.pruned)


def test_a_budget_too_small_keeps_the_protected_files_and_warns_once(tmp_path, caplog):
    folder = tmp_path / "checkpoints"
    retention = CheckpointRetention(every_n_epochs=1, keep_last=3, budget_gib=0)
    with caplog.at_level(logging.WARNING, logger=cr.__name__):
        _fit(folder, retention, max_epochs=3)
    assert _names(folder) == {"epoch_000.ckpt", "last.ckpt"}
    warnings = [r for r in caplog.records if "over its 0 GiB budget" in r.getMessage()]
    assert len(warnings) == 1


def test_leftovers_of_killed_writes_are_removed_and_reported(tmp_path):
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    # a write killed midway by a process that no longer exists (pids never reach 10**8)
    leftover = folder / ".last.ckpt.tmp-99999999-0123abcd"
    leftover.write_bytes(b"PK\x03\x04 truncated")
    report_path = tmp_path / "checkpoint_storage.json"
    _fit(folder, CheckpointRetention(keep_last=1, report_path=report_path), max_epochs=1)
    assert not leftover.exists()
    report = json.loads(report_path.read_text())
    assert report["removed_partial_writes"] == [leftover.name]


@pytest.mark.parametrize(
    ("key", "value"), [("every_n_epochs", 0), ("keep_last", 0), ("budget_gib", -1.0)]
)
def test_bad_arguments_are_refused_naming_the_key(key, value):
    with pytest.raises(ValueError, match=key):
        CheckpointRetention(**{key: value})


def test_a_disk_short_of_room_prunes_periodic_checkpoints_before_the_next_write(
    tmp_path, monkeypatch
):
    folder = tmp_path / "checkpoints"
    real = shutil.disk_usage
    # a disk that holds the folder and 20 MiB more: the 16 MiB allowance plus a 1 MiB checkpoint
    # fit only while the folder stays under 3 MiB
    capacity = 20 * MIB

    def small_disk(path):
        used = sum(p.stat().st_size for p in folder.iterdir()) if folder.is_dir() else 0
        return type(real(path))(capacity, used, capacity - used)

    monkeypatch.setattr(shutil, "disk_usage", small_disk)
    retention = CheckpointRetention(every_n_epochs=1, keep_last=100, budget_gib=None)
    _fit(folder, retention, max_epochs=6, width=512, latest_as_last=False)
    assert {"epoch_000.ckpt", "last.ckpt", "periodic_epoch_005.ckpt"} <= _names(folder)
    assert retention.pruned, "the writes needed room"
    assert all("room on the disk" in p.reason for p in retention.pruned)
    assert all(p.name.startswith("periodic_epoch_") for p in retention.pruned)


def test_the_storage_log_names_a_long_folder_on_one_line(tmp_path, caplog):
    folder = tmp_path / ("a_folder_name_long_enough_that_a_table_title_would_wrap_" * 2) / "ckpts"
    retention = CheckpointRetention(every_n_epochs=1, keep_last=1)
    with caplog.at_level(
        logging.INFO, logger="vramkit.core.callbacks.checkpoints.checkpoint_retention"
    ):
        _fit(folder, retention, max_epochs=1)
    (message,) = [r.getMessage() for r in caplog.records if "Checkpoint storage" in r.getMessage()]
    assert message.splitlines()[0] == f"Checkpoint storage in {folder}"  # whole, copyable
    assert all(len(line) <= 110 for line in message.splitlines()[1:])


def _fit_with_last(folder: Path, retention: CheckpointRetention, max_epochs: int) -> L.Trainer:
    """A fit whose last.ckpt comes from vramkit's ResumeCheckpoint, as train.py registers it."""
    latest = ResumeCheckpoint(dirpath=str(folder), every_n_train_steps=None)
    trainer = _trainer(folder, max_epochs, [retention, latest])
    trainer.fit(_ScoreFallsEachEpoch())
    return trainer


def test_a_periodic_checkpoint_is_last_ckpt_under_a_second_name_not_a_second_write(
    tmp_path, monkeypatch
):
    folder = tmp_path / "checkpoints"
    written: list[str] = []
    save = AtomicCheckpointIO.save_checkpoint

    def counted(self, checkpoint, path, storage_options=None):
        written.append(Path(path).name)
        return save(self, checkpoint, path, storage_options)

    monkeypatch.setattr(AtomicCheckpointIO, "save_checkpoint", counted)
    _fit_with_last(folder, CheckpointRetention(every_n_epochs=2, keep_last=3), max_epochs=3)
    assert written == ["last.ckpt"] * 3  # one write per epoch end, none for periodic_epoch_001
    periodic = folder / "periodic_epoch_001.ckpt"
    # written at epoch 1 as last.ckpt, which epoch 2 then replaced: the periodic name kept it
    assert torch.load(periodic, weights_only=True)["epoch"] == 1
    assert torch.load(folder / "last.ckpt", weights_only=True)["epoch"] == 2
    assert not periodic.samefile(folder / "last.ckpt")


def test_a_linked_periodic_checkpoint_is_one_file_and_pruning_it_keeps_last_ckpt(tmp_path):
    folder = tmp_path / "checkpoints"
    retention = CheckpointRetention(every_n_epochs=1, keep_last=1)
    trainer = _fit_with_last(folder, retention, max_epochs=2)
    last, newest = folder / "last.ckpt", folder / "periodic_epoch_001.ckpt"
    assert newest.samefile(last)
    assert cr._folder_bytes(folder) == last.stat().st_size  # counted once
    assert [p.name for p in retention.pruned] == ["periodic_epoch_000.ckpt"]
    retention._delete(newest, "test")  # frees nothing: last.ckpt still holds the file
    assert torch.load(last, weights_only=True)["epoch"] == 1
    assert trainer.global_step == 4


def test_without_hard_links_the_periodic_checkpoint_is_written_on_its_own(tmp_path, monkeypatch):
    def no_links(source, target):
        raise OSError(1, "Operation not permitted")

    monkeypatch.setattr(os, "link", no_links)
    folder = tmp_path / "checkpoints"
    _fit_with_last(folder, CheckpointRetention(every_n_epochs=1, keep_last=3), max_epochs=1)
    periodic = folder / "periodic_epoch_000.ckpt"
    assert not periodic.samefile(folder / "last.ckpt")
    assert torch.load(periodic, weights_only=True)["epoch"] == 0
    assert not [p for p in folder.iterdir() if p.name.startswith(".")]  # no partial link left
