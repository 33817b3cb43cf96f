"""A run resumed after max_time annealed its learning rate to zero trains at a real rate again."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from lightning.pytorch.callbacks import Timer

from vramkit.core.callbacks.max_time_annealing import MaxTimeAnnealing
from vramkit.core.optim.lr_schedules import WarmupDecayLR, WarmupDecaySchedule


class ClockTimer(Timer):
    def __init__(self, duration_s: float | None) -> None:
        super().__init__(duration=None if duration_s is None else {"seconds": duration_s})
        self.elapsed = 0.0

    def time_elapsed(self, stage: str = "train") -> float:
        return self.elapsed


def _annealed_run() -> tuple[dict, dict, int]:
    """A run stopped by max_time at step 80 with its rate annealed to 0: the callback's and the
    scheduler's saved states, and the step."""
    timer = ClockTimer(80.0)
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    scheduler = WarmupDecaySchedule(warmup_steps=10).build(optimizer, 1000)
    trainer = _trainer(timer, scheduler, step=0)
    callback = MaxTimeAnnealing(check_every_n_steps=10, safety_fraction=0.0, min_steps=10)
    callback.on_train_start(trainer, None)
    for _ in range(80):
        optimizer.step()
        scheduler.step()
        trainer.global_step += 1
        timer.elapsed += 1.0
        callback.on_train_batch_end(trainer, None, None, None, trainer.global_step)
    assert scheduler.get_last_lr()[0] == pytest.approx(0.0, abs=1e-12)
    return callback.state_dict(), scheduler.state_dict(), trainer.global_step


def _trainer(timer: Timer | None, scheduler: WarmupDecayLR, step: int) -> SimpleNamespace:
    return SimpleNamespace(
        callbacks=[timer] if timer is not None else [],
        lr_scheduler_configs=[SimpleNamespace(scheduler=scheduler, interval="step")],
        global_step=step,
        strategy=SimpleNamespace(broadcast=lambda value: value),
    )


def _resume(callback_state: dict, scheduler_state: dict, step: int, timer: Timer | None):
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.0)  # as restored
    scheduler = WarmupDecaySchedule(warmup_steps=10).build(optimizer, 1000)
    scheduler.load_state_dict(scheduler_state)
    callback = MaxTimeAnnealing(check_every_n_steps=10, safety_fraction=0.0, min_steps=10)
    callback.load_state_dict(callback_state)
    callback.on_train_start(_trainer(timer, scheduler, step), None)
    return scheduler, optimizer


def test_with_a_fresh_budget_the_end_is_replanned_from_the_saved_pace():
    callback_state, scheduler_state, step = _annealed_run()
    assert callback_state["pace_s_per_step"] == pytest.approx(1.0)
    scheduler, optimizer = _resume(callback_state, scheduler_state, step, ClockTimer(100.0))
    assert scheduler.total_steps == step + 100  # 100 s at 1 s/step
    rate = optimizer.param_groups[0]["lr"]
    assert rate == pytest.approx(0.1 * (1 - (step - 10) / (step + 100 - 10)) ** 0.9)
    assert rate > 0.05, "the next step already trains at the replanned rate"


def test_without_max_time_the_resumed_run_goes_back_to_the_planned_end():
    callback_state, scheduler_state, step = _annealed_run()
    scheduler, optimizer = _resume(callback_state, scheduler_state, step, timer=None)
    assert scheduler.total_steps == scheduler.planned_steps == 1000
    assert optimizer.param_groups[0]["lr"] > 0.09
