"""vramkit's own callbacks are registered as one: every hook reaches each member that implements
it (a member can still switch a per-batch hook off), Lightning skips the per-batch hooks no
member implements, and checkpoints restore each member's state, also from a checkpoint written
before the group existed."""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import LearningRateMonitor, ModelCheckpoint

from tests.core.callbacks.tiny_regression import TinyRegression, regression_loader
from vramkit.core.callbacks.checkpoints.random_state import RandomState
from vramkit.core.callbacks.checkpoints.resume_checkpoint import ResumeCheckpoint
from vramkit.core.callbacks.memory.memory_monitor import MemoryMonitor
from vramkit.core.callbacks.memory.phase_memory_hygiene import PhaseMemoryHygiene
from vramkit.core.callbacks.progress.progress_bar import RunProgressBar
from vramkit.core.callbacks.throughput_monitor import ThroughputMonitor
from vramkit.core.trainer_assembly.batch_hooks import PER_BATCH_HOOKS, switch_batch_hook
from vramkit.core.trainer_assembly.callback_group import CallbackGroup
from vramkit.core.trainer_assembly.working_set import group_vramkit_callbacks


class _Counter(L.Callback):
    """A phase-boundary callback with a state (its module is not vramkit's: never grouped
    by ``group_vramkit_callbacks``, but a valid member)."""

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
    trainer.fit(
        TinyRegression(), regression_loader(8, 4), regression_loader(8, 4), ckpt_path=ckpt_path
    )
    return trainer


def test_vramkits_callbacks_become_one_where_the_last_stood():
    lr, hygiene, memory = LearningRateMonitor(), PhaseMemoryHygiene(), MemoryMonitor()
    throughput, state, checkpoint = ThroughputMonitor(), RandomState(), ModelCheckpoint()
    bar = RunProgressBar()
    grouped = group_vramkit_callbacks([hygiene, lr, memory, throughput, bar, state, checkpoint])
    assert grouped[:2] == [lr, bar]  # Lightning's own and a progress bar stay
    assert isinstance(grouped[2], CallbackGroup)
    assert grouped[2].members == [hygiene, memory, throughput, state]
    assert grouped[3] is checkpoint  # checkpoint callbacks stay registered as they are
    assert group_vramkit_callbacks([lr, hygiene]) == [lr, hygiene]  # one alone: no group


def test_the_group_runs_the_batch_hooks_of_vramkits_callbacks_registered_alone(tmp_path):
    resume = ResumeCheckpoint(
        dirpath=str(tmp_path / "ckpt"), every_n_train_steps=3, min_interval_s=0
    )
    hygiene, memory = PhaseMemoryHygiene(), MemoryMonitor(summary=False)
    grouped = group_vramkit_callbacks([resume, hygiene, memory])
    assert grouped[0] is resume  # still registered: Lightning finds it by type
    group = grouped[1]
    assert resume.on_train_batch_end is None  # Lightning passes its batch hook over
    assert group._batch["on_train_batch_end"][-1].on_train_batch_end.__self__ is resume
    written: list[int] = []
    original = ResumeCheckpoint._write

    def spy(self: ResumeCheckpoint, trainer: L.Trainer, why: str, *copies: Any) -> None:
        written.append(trainer.global_step)
        original(self, trainer, why, *copies)

    resume._write = spy.__get__(resume)  # type: ignore[method-assign]
    _fit(tmp_path, grouped, epochs=3)  # 3 epochs of 2 batches: steps 1..6
    assert 3 in written and 6 in written, written  # the group's call at steps 3 and 6


class _CountsSteps(L.Callback):
    """Counts training batch starts; switches that hook off after ``until`` of them."""

    def __init__(self, until: int | None = None) -> None:
        self.until = until
        self.starts = 0

    def on_train_batch_start(self, *_: Any) -> None:
        self.starts += 1
        if self.starts == self.until:
            switch_batch_hook(self, "on_train_batch_start", on=False)


def test_per_batch_hooks_reach_their_members_until_one_switches_off(tmp_path):
    steady, once = _CountsSteps(), _CountsSteps(until=1)
    group = CallbackGroup([steady, once, _Counter("phase")])
    assert group.on_train_batch_end is None  # no member has it: Lightning skips it
    _fit(tmp_path, [group])  # 2 epochs of 2 batches
    assert (steady.starts, once.starts) == (4, 1)


def test_the_live_batch_hooks_are_decided_when_built_and_when_switched_not_per_batch():
    steady, once = _CountsSteps(), _CountsSteps()
    alone = _CountsSteps()
    group = CallbackGroup([steady, _Counter("phase")])
    # one live member: Lightning calls the member's own bound hook, no forwarding between
    assert group.on_train_batch_start == steady.on_train_batch_start
    switch_batch_hook(steady, "on_train_batch_start", on=False)
    assert group.on_train_batch_start is None  # Lightning passes it over
    switch_batch_hook(steady, "on_train_batch_start", on=True)
    assert group.on_train_batch_start == steady.on_train_batch_start
    both = CallbackGroup([steady, once], trailing=[alone])
    assert alone.on_train_batch_start is None  # taken over: Lightning passes it over there
    both.on_train_batch_start("trainer", "module", "batch", 0)  # one call runs all three
    assert (steady.starts, once.starts, alone.starts) == (1, 1, 1)
    switch_batch_hook(alone, "on_train_batch_start", on=False)
    switch_batch_hook(steady, "on_train_batch_start", on=False)
    assert both.on_train_batch_start == once.on_train_batch_start


def test_every_member_hears_its_hooks_and_lightning_skips_the_batch_hooks(tmp_path):
    first, second = _Counter("first"), _Counter("second")
    group = CallbackGroup([first, second])
    assert all(getattr(group, hook) is None for hook in PER_BATCH_HOOKS)  # none implemented
    _fit(tmp_path, [group])
    assert (first.epochs, first.validations) == (2, 2)
    assert (second.epochs, second.validations) == (2, 2)


def test_the_members_states_round_trip_through_a_checkpoint(tmp_path):
    trainer = _fit(tmp_path, [CallbackGroup([_Counter("a"), _Counter("b")])])
    trainer.save_checkpoint(tmp_path / "grouped.ckpt")
    saved = torch.load(tmp_path / "grouped.ckpt", weights_only=False)["callbacks"]
    assert saved["CallbackGroup"] == {"a": {"epochs": 2}, "b": {"epochs": 2}}
    resumed = [_Counter("a"), _Counter("b")]
    _fit(tmp_path, [CallbackGroup(resumed)], 3, tmp_path / "grouped.ckpt")
    assert [counter.epochs for counter in resumed] == [3, 3]  # 2 restored + 1 more


def test_a_checkpoint_from_before_the_group_restores_the_members(tmp_path):
    alone = [_Counter("a"), _Counter("b")]
    trainer = _fit(tmp_path, list(alone))
    trainer.save_checkpoint(tmp_path / "before.ckpt")
    states = torch.load(tmp_path / "before.ckpt", weights_only=False)["callbacks"]
    assert states["a"] == {"epochs": 2}  # each at the top level, as registered alone
    resumed = [_Counter("a"), _Counter("b")]
    group = CallbackGroup(resumed)
    group.on_load_checkpoint(trainer, trainer.lightning_module, {"callbacks": states})
    assert [counter.epochs for counter in resumed] == [2, 2]
