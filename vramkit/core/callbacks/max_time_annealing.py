"""End the learning-rate decay when ``trainer.max_time`` will end the run."""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Timer
from pydantic import Field

from vramkit.core.config.settings import Settings
from vramkit.core.optim.lr_schedules import WarmupDecayLR

log = logging.getLogger(__name__)


class MaxTimeAnnealingSettings(Settings):
    """The keys of ``callbacks.max_time_annealing`` (conf/callbacks/max_time_annealing.yaml)."""

    check_every_n_steps: int = Field(10, ge=1)
    """Optimizer steps between checks of the pace (one broadcast each in DDP)."""
    safety_fraction: float = Field(0.05, ge=0.0, lt=1.0)
    """Share of the time left kept for the final validation and checkpoint, in [0, 1)."""
    min_steps: int = Field(20, ge=1)
    """Optimizer steps this run takes before its pace is trusted."""


class MaxTimeAnnealing(L.Callback):
    """Ends the decay of a :class:`~vramkit.core.optim.lr_schedules.WarmupDecayLR` at the
    step where ``trainer.max_time`` will stop training.

    A poly schedule planned over ``max_epochs`` is still at about half the peak rate halfway
    through; a run that ``max_time`` stops there (a Colab session, a slower or busier machine
    than planned) ends with an unannealed model. The pace (seconds per optimizer step,
    validation included) is measured from step ``min_steps`` of this run on, which leaves
    start-up out; every ``check_every_n_steps`` steps after that, the steps that fit in the time
    left, less ``safety_fraction`` of it for the final validation and checkpoint, become the
    schedule's end. The end follows the pace both ways (never beyond the planned one), is saved
    with the scheduler, and a resumed run measures its own pace. Without ``max_time`` the
    callback does nothing.

    The last measured pace is saved with the checkpoint. A resumed run re-plans the end at once:
    from that pace and the time it has (a resumed run gets the whole ``max_time`` again, see
    :class:`~vramkit.core.callbacks.fresh_time_budget.FreshTimeBudget`), or back to the planned
    end when it has no ``max_time``, so it never trains on at the rate of zero an earlier stop
    had annealed to.

    Its keys are the fields of `MaxTimeAnnealingSettings`, given as keyword arguments
    and kept validated in ``self.settings`` (see `vramkit.core.config.settings`).
    """

    settings_class = MaxTimeAnnealingSettings

    def __init__(self, **settings: Any) -> None:
        self.settings = MaxTimeAnnealingSettings.for_component(type(self), settings)
        self._timer: Timer | None = None
        self._schedulers: list[WarmupDecayLR] = []
        self._start_step = 0
        self._reference: tuple[int, float] | None = None  # (step, elapsed s) the pace starts at
        self._last_checked_step = -1
        self._pace: float | None = None  # last measured seconds per step (saved with the run)
        self._resumed = False  # the state came from a checkpoint
        self.moves = 0  # times the end moved in this run (for the log and tests)

    def state_dict(self) -> dict[str, Any]:
        return {"pace_s_per_step": self._pace}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._pace = state_dict.get("pace_s_per_step")
        self._resumed = True

    def nothing_to_do(
        self, trainer: L.Trainer, datamodule: L.LightningDataModule | None
    ) -> str | None:
        """Without ``max_time`` no run is cut short (see ``working_set.py``)."""
        return None if max_time_timer(trainer) is not None else "trainer.max_time is not set"

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._timer = max_time_timer(trainer)
        self._schedulers = [
            config.scheduler
            for config in trainer.lr_scheduler_configs
            if isinstance(config.scheduler, WarmupDecayLR) and config.interval == "step"
        ]
        if self._timer is not None and not self._schedulers:
            log.info(
                "max_time is set, but no per-step WarmupDecayLR schedule can end earlier: "
                "a run that max_time stops keeps its learning rate"
            )
        self._start_step = trainer.global_step
        self._reference = None
        if self._resumed and self._schedulers:
            self._replan_after_resume(trainer)

    def _replan_after_resume(self, trainer: L.Trainer) -> None:
        step = trainer.global_step
        if self._timer is not None and self._pace is not None:
            left = max(0.0, self._timer.time_remaining() or 0.0)
            end = step + int(left * (1.0 - self.settings.safety_fraction) / self._pace)
            reason = f"{timedelta(seconds=int(left))} of max_time at {self._pace:.2f} s/step"
        else:
            end = max(scheduler.planned_steps for scheduler in self._schedulers)
            reason = "the planned end" if self._timer is None else "no measured pace yet"
        end = int(trainer.strategy.broadcast(end))
        before = self._schedulers[0].total_steps
        if not any([scheduler.end_at(end) for scheduler in self._schedulers]):
            return
        for scheduler in self._schedulers:
            # The rate of the next step was set by the saved run's last scheduler step, with the
            # old end; without this, one more step would run at it (zero after a max_time stop).
            for group, rate in zip(
                scheduler.optimizer.param_groups, scheduler.get_lr(), strict=True
            ):
                group["lr"] = rate
        log.info(
            "resumed at step %d: the learning-rate decay now ends at step %d (was %d; %s)",
            step,
            self._schedulers[0].total_steps,
            before,
            reason,
        )

    def on_train_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        if self._timer is None or not self._schedulers:
            return
        step = trainer.global_step
        steps_done = step - self._start_step
        if steps_done < self.settings.min_steps or step == self._last_checked_step:
            return
        self._last_checked_step = step
        if self._reference is None:
            self._reference = (step, self._timer.time_elapsed())
            return
        reference_step, reference_elapsed = self._reference
        if (step - reference_step) % self.settings.check_every_n_steps:
            return
        pace = (self._timer.time_elapsed() - reference_elapsed) / (step - reference_step)
        self._pace = pace
        left = max(0.0, self._timer.time_remaining() or 0.0)
        # Every process must decay alike, or DDP replicas would drift apart.
        end = int(
            trainer.strategy.broadcast(
                step + int(left * (1.0 - self.settings.safety_fraction) / pace)
            )
        )
        before = self._schedulers[0].total_steps
        if any([scheduler.end_at(end) for scheduler in self._schedulers]):
            self.moves += 1
            if self.moves == 1:
                log.info(
                    "max_time (%s left at %.2f s/step) ends training near step %d of the "
                    "planned %d: the learning rate now decays to zero by then",
                    timedelta(seconds=int(left)),
                    pace,
                    self._schedulers[0].total_steps,
                    self._schedulers[0].planned_steps,
                )
            else:
                log.debug(
                    "max_time annealing: end %d -> %d", before, self._schedulers[0].total_steps
                )


def max_time_timer(trainer: L.Trainer) -> Timer | None:
    """The Timer that ``trainer.max_time`` added, or None when there is no time limit."""
    timers = [callback for callback in trainer.callbacks if isinstance(callback, Timer)]
    return timers[0] if timers and timers[0].time_remaining() is not None else None
