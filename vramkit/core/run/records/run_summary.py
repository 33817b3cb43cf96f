"""The last lines of a training run: its best metric, the epoch and checkpoint it came from, and
whether ``max_time`` cut the run short of its plan (and by how much).

A run stopped by ``max_time`` looks like a finished one in every log and metric file; a user whose
model is weak should read why on the last line, not find it out from the step count.
"""

from __future__ import annotations

import math
from pathlib import Path

import lightning as L

from vramkit.core.callbacks.max_time_annealing import max_time_timer
from vramkit.core.io.checkpoint_io import UnreadableCheckpointError, read_checkpoint


def summary_lines(trainer: L.Trainer) -> list[str]:
    """What the run achieved, one line each: the best monitored metric (with its epoch and
    checkpoint path) and, when the time limit stopped it early, the steps done of those planned."""
    lines = []
    best = _best_line(trainer)
    if best:
        lines.append(best)
    cut = _cut_short_line(trainer)
    if cut:
        lines.append(cut)
    return lines


def _best_line(trainer: L.Trainer) -> str | None:
    checkpoint = trainer.checkpoint_callback
    monitor = getattr(checkpoint, "monitor", None)
    score = getattr(checkpoint, "best_model_score", None)
    path = getattr(checkpoint, "best_model_path", "")
    if checkpoint is None or monitor is None or score is None or not path:
        return None
    epoch = _saved_epoch(Path(path))
    at = f" at epoch {epoch}" if epoch is not None else ""
    return f"best {monitor} {float(score):.4f}{at}: {path}"


def _saved_epoch(path: Path) -> int | None:
    # mmap: reads the checkpoint's small records, not its tensors' bytes.
    try:
        saved = read_checkpoint(path)
    except UnreadableCheckpointError:
        return None  # a summary line never fails the run it describes
    epoch = saved.get("epoch")
    return int(epoch) if isinstance(epoch, int) else None


def _cut_short_line(trainer: L.Trainer) -> str | None:
    timer = max_time_timer(trainer)
    if timer is None or timer.time_remaining() > 0:
        return None
    planned = trainer.estimated_stepping_batches
    done = trainer.global_step
    if not math.isfinite(planned) or done >= planned:
        return None
    # current_epoch counts finished epochs: a stop inside epoch 0 finishes it, and it reads 1.
    # The epoch the last step ran in is the last one started (0-based, as Lightning numbers it).
    epoch = max(trainer.fit_loop.epoch_progress.current.started - 1, 0)
    return (
        f"trainer.max_time stopped the run at step {done} of {int(planned)} planned "
        f"({done / planned:.0%} of its plan, in epoch {epoch}); resume with "
        "ckpt_path=<run>/checkpoints/last.ckpt to train the rest"
    )
