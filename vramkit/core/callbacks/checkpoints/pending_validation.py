"""A checkpoint written between a training batch and the validation pass that follows it, or
during that pass, resumes into the pass.

Lightning (2.6, ``lightning/pytorch/loops``) reads a fit's position from the progress counters a
checkpoint holds (``checkpoint["loops"]["fit_loop"]``): ``ready``, ``started``, ``processed`` and
``completed`` of the training batches and of the validation batches. Two positions lose a
validation pass:

- saved at ``on_train_batch_end`` (a batch processed, not yet completed):
  ``_TrainingEpochLoop.reset`` completes the batch, and on an epoch's last batch ``_FitLoop.reset``
  counts the epoch as finished, so the resumed run trains the next epoch without validating this
  one, and never calls this epoch's ``on_train_epoch_end`` (where the best checkpoint is ranked);
- saved during the pass: the training batches all completed is "restarted on last", which skips
  the pass and ends the epoch with no validation metric to rank.

:func:`replay_validation` rewrites the counters to the one position Lightning resumes into a pass
from its first batch: the training batch completed, and the validation's first batch started but
not processed (``_EvaluationLoop.update_restart_stage``: "restarted mid-evaluation"). The resumed
``_TrainingEpochLoop.advance`` then goes straight to the pass, ``reset_on_restart`` sets its
counters back to zero, and the pass runs over all its batches before training goes on. The step
counter used by the loggers (``_batches_that_stepped``) comes out as in the uninterrupted run: it
is incremented once after the pass, as there.
"""

from __future__ import annotations

import math
from typing import Any

import lightning as L


def validation_pending(trainer: L.Trainer) -> bool:
    """Whether ``trainer`` (fitting) is between a training batch that a validation pass follows
    and the end of that pass's last batch: inside that batch's ``on_train_batch_end``, or in the
    pass before its last batch completed."""
    epoch_loop = trainer.fit_loop.epoch_loop
    if trainer.validating:
        validated = epoch_loop.val_loop.batch_progress
        return not (
            validated.is_last_batch and validated.current.completed == validated.current.ready
        )
    trained = epoch_loop.batch_progress.current
    if not trainer.training or trained.processed != trained.completed + 1:
        return False  # not inside a training batch's end hooks
    return _validation_follows_batch(trainer)


def _validation_follows_batch(trainer: L.Trainer) -> bool:
    """Whether Lightning's schedule validates after the training batch now ending (as
    ``_TrainingEpochLoop._should_check_val_fx`` decides, leaving out the pass that a stop
    requested through ``trainer.should_stop`` adds: that one is not part of the run to resume)."""
    epoch_loop = trainer.fit_loop.epoch_loop
    every_n_epochs = trainer.check_val_every_n_epoch
    if not trainer.enable_validation or (
        every_n_epochs is not None and (trainer.current_epoch + 1) % every_n_epochs
    ):
        return False
    interval = trainer.val_check_batch  # training batches between passes
    if interval is None:
        return False  # wall-clock intervals: Lightning decides at the time, on a clock
    if math.isinf(interval):
        return epoch_loop.batch_progress.is_last_batch  # a loader of unknown length
    batches = epoch_loop.batch_idx if every_n_epochs is not None else epoch_loop.total_batch_idx
    return (batches + 1) % int(interval) == 0


def replay_validation(checkpoint: dict[str, Any]) -> None:
    """Make ``checkpoint`` resume at the first batch of the validation pass after its training
    batch (see the module's note)."""
    loops = checkpoint["loops"]["fit_loop"]
    trained = loops["epoch_loop.batch_progress"]
    for counters in (trained["total"], trained["current"]):
        counters["completed"] = counters["processed"]
    validated = loops["epoch_loop.val_loop.batch_progress"]
    before = validated["total"]["completed"]
    validated["total"] = {"ready": before + 1, "started": before + 1} | {
        "processed": before,
        "completed": before,
    }
    validated["current"] = {"ready": 1, "started": 1, "processed": 0, "completed": 0}
    validated["is_last_batch"] = False
