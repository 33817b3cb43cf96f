"""AtomicCheckpointIO: a write that dies midway leaves the old file or none, never a torn one."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import pytest
import torch
from hydra.utils import instantiate
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from vramkit.core.io import checkpoint_io
from vramkit.core.io.checkpoint_io import AtomicCheckpointIO, atomic_write_bytes, is_partial_write


class _WriteDies(Exception):
    """Stands for the process being killed while torch.save streams the file."""


def _save_that_dies_midway(real_save):
    def save(obj, handle):
        real_save(obj, handle)
        handle.truncate(handle.tell() // 2)  # what a kill leaves: a prefix of the file
        raise _WriteDies

    return save


def test_a_save_that_dies_keeps_the_previous_checkpoint_and_no_temporary(tmp_path, monkeypatch):
    target = tmp_path / "last.ckpt"
    io = AtomicCheckpointIO()
    io.save_checkpoint({"epoch": 1, "w": torch.ones(1000)}, target)
    monkeypatch.setattr(checkpoint_io.torch, "save", _save_that_dies_midway(torch.save))
    with pytest.raises(_WriteDies):
        io.save_checkpoint({"epoch": 2, "w": torch.zeros(1000)}, target)
    assert [p.name for p in tmp_path.iterdir()] == ["last.ckpt"]
    assert torch.load(target, weights_only=True)["epoch"] == 1


def test_a_first_save_that_dies_leaves_no_file(tmp_path, monkeypatch):
    monkeypatch.setattr(checkpoint_io.torch, "save", _save_that_dies_midway(torch.save))
    with pytest.raises(_WriteDies):
        AtomicCheckpointIO().save_checkpoint({"w": torch.ones(10)}, tmp_path / "sub" / "a.ckpt")
    assert list((tmp_path / "sub").iterdir()) == []


def test_a_save_writes_a_loadable_file_through_a_hidden_temporary(tmp_path, monkeypatch):
    seen = []
    real_replace = checkpoint_io.os.replace

    def replace(source, destination):
        seen.append(Path(source))
        real_replace(source, destination)

    monkeypatch.setattr(checkpoint_io.os, "replace", replace)
    target = tmp_path / "model.ckpt"
    AtomicCheckpointIO().save_checkpoint({"w": torch.arange(5)}, f"file://{target}")
    (temporary,) = seen
    assert temporary.parent == tmp_path and is_partial_write(temporary)
    assert not is_partial_write(target) and not temporary.exists()
    assert torch.equal(torch.load(target, weights_only=True)["w"], torch.arange(5))
    atomic_write_bytes(tmp_path / "report.json", b"{}")
    assert (tmp_path / "report.json").read_bytes() == b"{}"


class _Tiny(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(4, 1)

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        return self.net(batch[0]).pow(2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(TensorDataset(torch.randn(4, 4)), batch_size=2)


def test_a_run_killed_while_lightning_saves_leaves_only_loadable_checkpoints(tmp_path, monkeypatch):
    calls = {"n": 0}
    real_save = torch.save

    def save(obj, handle):
        calls["n"] += 1
        if calls["n"] == 3:  # ModelCheckpoint's third write dies
            _save_that_dies_midway(real_save)(obj, handle)
        real_save(obj, handle)

    monkeypatch.setattr(checkpoint_io.torch, "save", save)
    folder = tmp_path / "checkpoints"
    trainer = L.Trainer(
        accelerator="cpu",
        max_epochs=5,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[ModelCheckpoint(dirpath=folder, save_top_k=-1, save_last=True)],
        plugins=[AtomicCheckpointIO()],
    )
    with pytest.raises(_WriteDies):
        trainer.fit(_Tiny())
    files = sorted(folder.iterdir())
    assert files and not any(is_partial_write(p) for p in files)
    for path in files:
        torch.load(path, weights_only=True)  # every file that looks like a checkpoint is whole


def test_the_trainer_config_takes_the_plugin(compose_config):
    # the lines proposed for conf/trainer/default.yaml, given as an override
    plugin = "+trainer.plugins=[{_target_:vramkit.core.io.checkpoint_io.AtomicCheckpointIO}]"
    cfg = compose_config("+hw=cpu", plugin)
    trainer = instantiate(cfg.trainer, logger=False, enable_progress_bar=False)
    assert isinstance(trainer.strategy.checkpoint_io, AtomicCheckpointIO)


def _bad_checkpoint(kind: str, folder: Path) -> Path:
    path = folder / f"{kind}.ckpt"
    if kind == "folder":
        path.mkdir()
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "text":
        path.write_text("epoch: 3\n")
    elif kind == "half":
        torch.save({"state_dict": {"w": torch.zeros(1000)}}, path)
        path.write_bytes(path.read_bytes()[:2000])
    elif kind == "weights only":
        torch.save({"w": torch.zeros(2)}, path)
    return path


@pytest.mark.parametrize(
    ("kind", "said"),
    [
        ("missing", "no file at"),
        ("folder", "is a folder, not a checkpoint file"),
        ("empty", "is empty (0 bytes)"),
        ("text", "is not a PyTorch checkpoint (9 bytes, not a torch.save archive)"),
        ("half", "is truncated (2000 bytes of a torch.save archive whose end is missing)"),
        ("weights only", "is not a Lightning checkpoint (no state_dict; it holds ['w'])"),
    ],
)
def test_a_file_that_is_no_checkpoint_is_named_without_a_traceback(kind, said, tmp_path):
    with pytest.raises(checkpoint_io.UnreadableCheckpointError) as refused:
        checkpoint_io.read_checkpoint(_bad_checkpoint(kind, tmp_path))
    assert said in str(refused.value)
    assert "\n" not in str(refused.value)


def test_a_lightning_checkpoint_is_read_whole(tmp_path):
    path = tmp_path / "last.ckpt"
    torch.save({"state_dict": {"w": torch.arange(3.0)}, "epoch": 2}, path)
    checkpoint = checkpoint_io.read_checkpoint(path)
    assert checkpoint["epoch"] == 2
    assert torch.equal(checkpoint["state_dict"]["w"], torch.arange(3.0))


def test_a_link_replaces_its_target_and_later_writes_replace_one_name_only(tmp_path):
    last, periodic = tmp_path / "last.ckpt", tmp_path / "periodic.ckpt"
    checkpoint_io.atomic_write_bytes(last, b"epoch 1")
    periodic.write_bytes(b"an older periodic file")
    checkpoint_io.atomic_link(last, periodic)
    assert periodic.samefile(last) and periodic.read_bytes() == b"epoch 1"
    checkpoint_io.atomic_write_bytes(last, b"epoch 2")  # a new file renamed over one name
    assert (last.read_bytes(), periodic.read_bytes()) == (b"epoch 2", b"epoch 1")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt", "periodic.ckpt"]


def test_a_link_that_cannot_be_made_leaves_the_target_as_it_was(tmp_path):
    target = tmp_path / "periodic.ckpt"
    target.write_bytes(b"kept")
    with pytest.raises(OSError):
        checkpoint_io.atomic_link(tmp_path / "missing.ckpt", target)
    assert target.read_bytes() == b"kept"
    assert [p.name for p in tmp_path.iterdir()] == ["periodic.ckpt"]
