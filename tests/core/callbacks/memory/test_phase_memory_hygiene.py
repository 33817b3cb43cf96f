"""The hygiene callback cleans at every phase boundary, and touches CUDA only when it is in use."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import lightning as L
import pytest
import torch
from lightning.pytorch.trainer.states import TrainerFn
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from vramkit.core.callbacks.memory.phase_memory_hygiene import PhaseMemoryHygiene


class _Linear(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(2, 1)

    def training_step(self, batch, batch_idx):
        return self.layer(batch[0]).pow(2).mean()

    def validation_step(self, batch, batch_idx):
        self.layer(batch[0])

    def test_step(self, batch, batch_idx):
        self.layer(batch[0])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class _Events(L.Callback):
    def __init__(self, events: list[str]) -> None:
        self.events = events

    def on_train_batch_end(self, *_):
        self.events.append("train")

    def on_validation_batch_end(self, *_):
        self.events.append("val")

    def on_test_batch_end(self, *_):
        self.events.append("test")


def test_collects_between_training_and_validation_both_ways_and_before_testing(monkeypatch):
    events: list[str] = []
    monkeypatch.setattr(gc, "collect", lambda *args: events.append("clean") or 0)
    hygiene = PhaseMemoryHygiene()
    trainer = L.Trainer(
        accelerator="cpu",
        max_epochs=2,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        callbacks=[hygiene, _Events(events)],
    )
    loader = DataLoader(TensorDataset(torch.randn(4, 2)), batch_size=2)
    module = _Linear()
    trainer.fit(module, train_dataloaders=loader, val_dataloaders=loader)
    trainer.test(module, dataloaders=loader, verbose=False)
    # one entry per run of batches of a phase; every cleaning kept
    phases = [e for i, e in enumerate(events) if e == "clean" or i == 0 or e != events[i - 1]]
    assert phases == [
        "train",
        "clean",  # training -> validation
        "val",
        "clean",  # validation -> training
        "train",
        "clean",
        "val",
        "clean",  # fit ends after validation: still cleaned, as training could resume
        "clean",  # before testing
        "test",
    ]
    assert hygiene.cleanings == 5


def test_empties_the_cuda_cache_only_once_cuda_is_in_use_and_leaves_the_peaks(monkeypatch):
    calls: list[str] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append("empty_cache"))
    monkeypatch.setattr(
        torch.cuda, "reset_peak_memory_stats", lambda *a: calls.append("reset_peaks")
    )
    fitting = SimpleNamespace(state=SimpleNamespace(fn=TrainerFn.FITTING))
    hygiene = PhaseMemoryHygiene()

    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    hygiene.on_validation_start(fitting, None)
    assert calls == []  # emptying an unused cache would create a CUDA context

    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    hygiene.on_validation_start(fitting, None)
    hygiene.on_validation_end(fitting, None)
    hygiene.on_test_start(fitting, None)
    # the peaks are the memory monitor's: it reads them before it resets them
    assert calls == ["empty_cache"] * 3


@pytest.mark.parametrize("fn", [TrainerFn.VALIDATING, TrainerFn.TESTING])
def test_a_standalone_validation_is_not_followed_by_a_cleaning(fn):
    hygiene = PhaseMemoryHygiene()
    hygiene.on_validation_end(SimpleNamespace(state=SimpleNamespace(fn=fn)), None)
    assert hygiene.cleanings == 0


class _Cycle:
    """An object in a reference cycle: only the garbage collector frees it."""

    def __init__(self) -> None:
        self.me = self


class _FreezeProbe(L.Callback):
    """Records, at each validation's end, the frozen count and whether a cycle made in
    training was freed by the cleaning before validation."""

    def __init__(self) -> None:
        self.frozen_counts: list[int] = []
        self.freed: list[bool] = []
        self._made: Any = None

    def on_train_batch_end(self, *_: Any) -> None:
        self._made = weakref.ref(_Cycle())

    def on_validation_end(self, *_: Any) -> None:
        self.frozen_counts.append(gc.get_freeze_count())
        self.freed.append(self._made is not None and self._made() is None)


@pytest.fixture(autouse=True)
def _unfrozen() -> Iterator[None]:
    """Each test starts with nothing frozen (a test earlier in this process may have frozen its
    imports, as `vramkit plan` does) and leaves the process as it found it."""
    frozen = gc.get_freeze_count()
    gc.unfreeze()
    yield
    gc.unfreeze()
    if frozen:
        gc.freeze()


def _fit_with(callbacks: list[L.Callback], module: L.LightningModule, epochs: int = 1) -> None:
    trainer = L.Trainer(
        accelerator="cpu",
        max_epochs=epochs,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        callbacks=callbacks,
    )
    loader = DataLoader(TensorDataset(torch.randn(4, 2)), batch_size=2)
    trainer.fit(module, train_dataloaders=loader, val_dataloaders=loader)


def test_what_lives_before_the_fit_is_frozen_for_it_and_its_garbage_still_collected():
    assert gc.get_freeze_count() == 0
    gc.disable()  # no automatic collection before the fit starts: the old cycle reaches it
    try:
        before_fit = weakref.ref(_Cycle())  # garbage older than the fit: frozen, not collected
        probe = _FreezeProbe()
        _fit_with([PhaseMemoryHygiene(), probe], _Linear())
    finally:
        gc.enable()
    assert all(count > 0 for count in probe.frozen_counts) and probe.frozen_counts
    assert probe.freed == [True]  # a cycle the fit made is gone after the next cleaning
    assert gc.get_freeze_count() == 0  # the fit's end gives the objects back to the collector
    assert before_fit() is not None
    gc.collect()
    assert before_fit() is None


class _Fails(_Linear):
    def training_step(self, batch, batch_idx):
        raise RuntimeError("step failed")


def test_a_failed_fit_gives_the_frozen_objects_back():
    with pytest.raises(RuntimeError, match="step failed"):
        _fit_with([PhaseMemoryHygiene()], _Fails())
    assert gc.get_freeze_count() == 0


def test_a_freeze_made_elsewhere_is_left_as_it_is():
    gc.freeze()
    try:
        _fit_with([PhaseMemoryHygiene()], _Linear())
        assert gc.get_freeze_count() > 0  # not given back: it was not this callback's freeze
    finally:
        gc.unfreeze()
