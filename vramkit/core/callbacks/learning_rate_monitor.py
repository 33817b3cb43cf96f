"""Lightning's learning-rate monitor, with a cheaper test of whether a step logs."""

from __future__ import annotations

from typing import Any

import lightning as L
from lightning.pytorch.callbacks import LearningRateMonitor

from vramkit.core.compat import lightning_private


class StepLearningRateMonitor(LearningRateMonitor):
    """``LearningRateMonitor`` whose per-step hook returns at once on steps that do not log.

    Lightning's hook asks ``trainer._logger_connector.should_update_logs`` on every step, a
    property that finds the active loop and compares enums: about 160 bytecodes per step of the
    ~3,300 vramkit's defaults added to a step (opcode tracing of
    ``benchmarks/step_overhead.py``). During a fit that question reduces to the step count
    modulo ``log_every_n_steps`` (or a stop), which this asks first (about 20 bytecodes);
    on the steps that may log, Lightning's own hook decides and logs as before.
    """

    def on_train_batch_start(self, trainer: L.Trainer, *args: Any, **kwargs: Any) -> None:
        every = trainer.log_every_n_steps
        # `+ 1`: the step about to run, as in Lightning's should_update_logs
        step = lightning_private.batches_that_stepped(trainer) + 1
        if every and (step % every == 0 or trainer.should_stop):
            super().on_train_batch_start(trainer, *args, **kwargs)
