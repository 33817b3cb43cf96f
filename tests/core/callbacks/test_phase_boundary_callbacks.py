"""vramkit's callbacks without per-batch hooks are registered as one: Lightning passes over one
callback per batch hook, every other hook still reaches each member, and checkpoints restore
each member's state, also from a checkpoint written before the group existed."""

from __future__ import annotations

from typing import Any

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import LearningRateMonitor, ModelCheckpoint
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from vramkit.core.callbacks.batch_hooks import PER_BATCH_HOOKS
from vramkit.core.callbacks.memory_monitor import MemoryMonitor
from vramkit.core.callbacks.phase_boundary_callbacks import PhaseBoundaryCallbacks
from vramkit.core.callbacks.phase_memory_hygiene import PhaseMemoryHygiene
from vramkit.core.callbacks.random_state import RandomState
from vramkit.core.callbacks.throughput_monitor import ThroughputMonitor
from vramkit.core.callbacks.working_set import group_phase_boundary


class _Counter(L.Callback):
    """A phase-boundary callback with a state (its module is not vramkit's: never grouped
    by ``group_phase_boundary``, but a valid member)."""

    def __init__(self, state_key: str) -> None:
        self.key = state_key
        self.epochs = 0
        self.validations = 0

    @property
    def state_key(self) -> str:
        return self.key

    def on_train_epoch_end(self, *_: Any) -> None:
        self.epochs += 1

    def on_validation_end(self, *_: Any) -> None:
        self.validations += 1

    def state_dict(self) -> dict[str, Any]:
        return {"epochs": self.epochs}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.epochs = state_dict["epochs"]


class _Tiny(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(4, 1)

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        return F.mse_loss(self.net(x).squeeze(-1), y)

    def validation_step(self, batch: list[torch.Tensor], batch_idx: int) -> None:
        x, y = batch
        self.log("val/loss", F.mse_loss(self.net(x).squeeze(-1), y))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _loader() -> DataLoader:
    generator = torch.Generator().manual_seed(0)
    return DataLoader(
        TensorDataset(torch.randn(8, 4, generator=generator), torch.randn(8, generator=generator)),
        batch_size=4,
    )


def _fit(
    tmp_path, callbacks: list[L.Callback], epochs: int = 2, ckpt_path: Any = None
) -> L.Trainer:
    trainer = L.Trainer(
        accelerator="cpu",
        max_epochs=epochs,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        default_root_dir=tmp_path,
        callbacks=callbacks,
    )
    trainer.fit(_Tiny(), _loader(), _loader(), ckpt_path=ckpt_path)
    return trainer


def test_vramkits_phase_boundary_callbacks_become_one_where_the_last_stood():
    lr, hygiene, memory = LearningRateMonitor(), PhaseMemoryHygiene(), MemoryMonitor()
    throughput, state, checkpoint = ThroughputMonitor(), RandomState(), ModelCheckpoint()
    grouped = group_phase_boundary([hygiene, lr, memory, throughput, state, checkpoint])
    assert grouped[:2] == [lr, throughput]  # Lightning's own and a per-batch one stay
    assert isinstance(grouped[2], PhaseBoundaryCallbacks)
    assert grouped[2].members == [hygiene, memory, state]
    assert grouped[3] is checkpoint  # checkpoint callbacks stay registered as they are
    assert group_phase_boundary([lr, hygiene]) == [lr, hygiene]  # one alone: nothing to group


def test_a_callback_with_a_batch_hook_cannot_join():
    with pytest.raises(ValueError, match="ThroughputMonitor"):
        PhaseBoundaryCallbacks([RandomState(), ThroughputMonitor()])


def test_every_member_hears_its_hooks_and_lightning_skips_the_batch_hooks(tmp_path):
    first, second = _Counter("first"), _Counter("second")
    group = PhaseBoundaryCallbacks([first, second])
    assert all(getattr(group, hook) is None for hook in PER_BATCH_HOOKS)
    _fit(tmp_path, [group])
    assert (first.epochs, first.validations) == (2, 2)
    assert (second.epochs, second.validations) == (2, 2)


def test_the_members_states_round_trip_through_a_checkpoint(tmp_path):
    trainer = _fit(tmp_path, [PhaseBoundaryCallbacks([_Counter("a"), _Counter("b")])])
    trainer.save_checkpoint(tmp_path / "grouped.ckpt")
    saved = torch.load(tmp_path / "grouped.ckpt", weights_only=False)["callbacks"]
    assert saved["PhaseBoundaryCallbacks"] == {"a": {"epochs": 2}, "b": {"epochs": 2}}
    resumed = [_Counter("a"), _Counter("b")]
    _fit(tmp_path, [PhaseBoundaryCallbacks(resumed)], 3, tmp_path / "grouped.ckpt")
    assert [counter.epochs for counter in resumed] == [3, 3]  # 2 restored + 1 more


def test_a_checkpoint_from_before_the_group_restores_the_members(tmp_path):
    alone = [_Counter("a"), _Counter("b")]
    trainer = _fit(tmp_path, list(alone))
    trainer.save_checkpoint(tmp_path / "before.ckpt")
    states = torch.load(tmp_path / "before.ckpt", weights_only=False)["callbacks"]
    assert states["a"] == {"epochs": 2}  # each at the top level, as registered alone
    resumed = [_Counter("a"), _Counter("b")]
    group = PhaseBoundaryCallbacks(resumed)
    group.on_load_checkpoint(trainer, trainer.lightning_module, {"callbacks": states})
    assert [counter.epochs for counter in resumed] == [2, 2]
