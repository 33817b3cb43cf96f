"""A resumed run gets the whole ``trainer.max_time`` again."""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Timer

log = logging.getLogger(__name__)

_TRAINING = "train"  # Timer's key of the training stage (RunningStage.TRAINING.value)


class FreshTimeBudget(L.Callback):
    """Resets the training time a checkpoint carries for ``trainer.max_time``.

    Lightning's ``Timer`` (the callback ``max_time`` installs) saves the training time spent so
    far and, on resume, counts it against the limit (``lightning/pytorch/callbacks/timer.py``,
    ``load_state_dict``): a run that ``max_time`` stopped resumes only to stop again at once. With
    this callback each run, resumed or not, trains for up to ``max_time`` of its own; leave it out
    (``callbacks.fresh_time_budget=null``) for one limit over all the resumed runs together.
    """

    def on_load_checkpoint(
        self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        # Lightning calls every callback's on_load_checkpoint before any load_state_dict
        # (CheckpointConnector.restore_callbacks), so the Timer reads the reset value.
        states = checkpoint.get("callbacks", {})
        for timer in (callback for callback in trainer.callbacks if isinstance(callback, Timer)):
            elapsed = states.get(timer.state_key, {}).get("time_elapsed", {})
            spent = float(elapsed.get(_TRAINING, 0.0))
            if spent <= 0.0:
                continue
            elapsed[_TRAINING] = 0.0
            log.info(
                "resuming after %s of training: max_time (%s) counts afresh from here",
                timedelta(seconds=round(spent)),
                timedelta(seconds=round(timer.time_remaining() or 0.0)),
            )
