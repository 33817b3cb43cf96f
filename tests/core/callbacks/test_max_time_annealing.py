"""The poly schedule's end moves to where max_time will stop the run, never past the plan, and
survives a checkpoint; without max_time nothing changes."""

from __future__ import annotations

import time
from types import SimpleNamespace

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import Timer
from torch.utils.data import DataLoader, TensorDataset

from vramkit.core.callbacks.max_time_annealing import MaxTimeAnnealing
from vramkit.core.optim.lr_schedules import WarmupDecayLR, WarmupDecaySchedule


class ClockTimer(Timer):
    """A Timer whose elapsed time the test sets (seconds)."""

    def __init__(self, duration_s: float | None) -> None:
        super().__init__(duration=None if duration_s is None else {"seconds": duration_s})
        self.elapsed = 0.0

    def time_elapsed(self, stage: str = "train") -> float:
        return self.elapsed


def _scheduler(total_steps: int = 1000, warmup_steps: int = 10) -> WarmupDecayLR:
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    return WarmupDecaySchedule(warmup_steps=warmup_steps).build(optimizer, total_steps)


def _trainer(timer: Timer, scheduler: WarmupDecayLR) -> SimpleNamespace:
    return SimpleNamespace(
        callbacks=[timer],
        lr_scheduler_configs=[SimpleNamespace(scheduler=scheduler, interval="step")],
        global_step=0,
        strategy=SimpleNamespace(broadcast=lambda value: value),
    )


def _advance(callback, trainer, scheduler, timer, steps: int, seconds_per_step: float) -> None:
    for _ in range(steps):
        scheduler.optimizer.step()
        scheduler.step()
        trainer.global_step += 1
        timer.elapsed += seconds_per_step
        callback.on_train_batch_end(trainer, None, None, None, trainer.global_step)


def test_the_decay_ends_when_the_time_runs_out() -> None:
    timer, scheduler = ClockTimer(120.0), _scheduler(total_steps=1000)
    trainer = _trainer(timer, scheduler)
    callback = MaxTimeAnnealing(check_every_n_steps=10, safety_fraction=0.05, min_steps=20)
    callback.on_train_start(trainer, None)
    _advance(callback, trainer, scheduler, timer, 20, 3.0)  # a slow start is left out
    assert scheduler.total_steps == 1000
    _advance(callback, trainer, scheduler, timer, 10, 1.0)
    # 1 s/step since step 20, 50 s left, 95% of them usable: 47 more steps.
    assert scheduler.total_steps == 30 + 47
    assert callback.moves == 1
    _advance(callback, trainer, scheduler, timer, 50, 1.0)  # the time is up at step 80
    assert timer.time_remaining() <= 0
    assert scheduler.get_last_lr()[0] == pytest.approx(0.0, abs=1e-12)


def test_the_end_follows_the_pace_but_never_passes_the_plan() -> None:
    timer, scheduler = ClockTimer(400.0), _scheduler(total_steps=300)
    trainer = _trainer(timer, scheduler)
    callback = MaxTimeAnnealing(check_every_n_steps=10, safety_fraction=0.0, min_steps=10)
    callback.on_train_start(trainer, None)
    _advance(callback, trainer, scheduler, timer, 20, 2.0)  # 360 s left at 2 s/step
    assert scheduler.total_steps == 20 + 180
    _advance(callback, trainer, scheduler, timer, 40, 0.5)  # faster: 0.8 s/step on average
    assert scheduler.total_steps == 300, "more would fit, but not more than planned"


def test_without_max_time_the_schedule_is_left_alone() -> None:
    timer, scheduler = ClockTimer(None), _scheduler(total_steps=1000)
    trainer = _trainer(timer, scheduler)
    callback = MaxTimeAnnealing(check_every_n_steps=1, min_steps=1)
    callback.on_train_start(trainer, None)
    _advance(callback, trainer, scheduler, timer, 30, 100.0)
    assert scheduler.total_steps == 1000 and callback.moves == 0


def test_a_resumed_run_measures_its_pace_from_its_own_start() -> None:
    timer, scheduler = ClockTimer(1000.0), _scheduler(total_steps=5000)
    trainer = _trainer(timer, scheduler)
    trainer.global_step, timer.elapsed = 400, 600.0  # restored from the checkpoint
    callback = MaxTimeAnnealing(check_every_n_steps=10, safety_fraction=0.0, min_steps=10)
    callback.on_train_start(trainer, None)
    _advance(callback, trainer, scheduler, timer, 20, 2.0)  # 2 s/step now, 360 s left
    assert scheduler.total_steps == 420 + 180


def test_the_shortened_end_is_saved_with_the_scheduler() -> None:
    scheduler = _scheduler(total_steps=1000)
    for _ in range(30):
        scheduler.optimizer.step()
        scheduler.step()
    assert scheduler.end_at(200) and not scheduler.end_at(200)
    assert scheduler.end_at(5000) and scheduler.total_steps == 1000, "never beyond the plan"
    assert scheduler.end_at(10) and scheduler.total_steps == 31, "never before the next step"
    fresh = _scheduler(total_steps=1000, warmup_steps=10)
    assert fresh.end_at(3) and fresh.total_steps == 11, "never inside the warm-up"
    restored = _scheduler(total_steps=1000)
    restored.load_state_dict(scheduler.state_dict())
    assert restored.total_steps == scheduler.total_steps
    assert restored.get_last_lr() == scheduler.get_last_lr()


def test_the_scheduler_follows_the_schedule_formula() -> None:
    schedule = WarmupDecaySchedule(warmup_steps=5, poly_power=0.9)
    scheduler = _scheduler(total_steps=40, warmup_steps=5)
    rates = [scheduler.get_last_lr()[0]]
    for _ in range(45):
        scheduler.optimizer.step()
        scheduler.step()
        rates.append(scheduler.get_last_lr()[0])
    expected = [0.1 * schedule.factor(step, 40) for step in range(46)]
    assert rates == pytest.approx(expected, abs=1e-12)
    assert rates[4] == pytest.approx(0.1) and rates[40:] == [0.0] * 6


@pytest.mark.parametrize(
    ("arguments", "key"),
    [
        ({"check_every_n_steps": 0}, "check_every_n_steps"),
        ({"min_steps": 2.5}, "min_steps"),
        ({"safety_fraction": 1.0}, "safety_fraction"),
    ],
)
def test_bad_settings_name_their_key(arguments: dict, key: str) -> None:
    with pytest.raises(ValueError, match=f"max_time_annealing.{key}"):
        MaxTimeAnnealing(**arguments)


class SlowRegression(L.LightningModule):
    """A one-weight model whose steps take about 40 ms, scheduled by WarmupDecaySchedule."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))

    def training_step(self, batch, batch_idx):
        time.sleep(0.04)
        return ((self.weight - batch[0]) ** 2).mean()

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
        return WarmupDecaySchedule(warmup_steps=5).lightning_config(
            optimizer, int(self.trainer.estimated_stepping_batches)
        )


def test_a_real_fit_stopped_by_max_time_ends_annealed(tmp_path) -> None:
    data = DataLoader(TensorDataset(torch.ones(64, 1)), batch_size=1)
    callback = MaxTimeAnnealing(check_every_n_steps=5, safety_fraction=0.1, min_steps=10)
    trainer = L.Trainer(
        accelerator="cpu",
        max_epochs=100,  # 6400 steps planned; max_time stops it after about 75
        max_time={"seconds": 3},
        callbacks=[callback],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
    )
    trainer.fit(SlowRegression(), train_dataloaders=data)
    (config,) = trainer.lr_scheduler_configs
    scheduler = config.scheduler
    assert callback.moves >= 1
    assert scheduler.planned_steps == 6400
    assert trainer.global_step < 200 and scheduler.total_steps < 200
    last_rate = scheduler.get_last_lr()[0]
    assert last_rate < 0.1 * 0.2, f"still at {last_rate / 0.1:.0%} of the peak when stopped"
