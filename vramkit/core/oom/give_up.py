"""Stop every process together when one of them cannot fit a single sample.

Under DDP a process that raises leaves the others waiting in their next collective (NCCL
waits until its timeout). A process that gives up therefore keeps stepping without work: its
gradients are zero and its validation steps empty, so every collective the others start is
matched. At the end of every validation and training epoch, which every process reaches,
one all-reduce (:func:`stop_together`) tells them all, and all raise. That is the guard's
only collective: a step where nothing failed runs none.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import torch

from vramkit.core.compat import lightning_private

if TYPE_CHECKING:
    from vramkit.core.oom.recovery_state import GuardedModule

log = logging.getLogger(__name__)


def stop_together(module: GuardedModule) -> None:
    """Raise ``torch.cuda.OutOfMemoryError`` on every process if any gave up; with one
    process, or when none did, return. Every process must call it at the same point."""
    trainer = lightning_private.attached_trainer(module)
    if trainer is None or trainer.world_size < 2:
        return
    reason = module.oom_state.gave_up
    if not trainer.strategy.reduce_boolean_decision(reason is not None, all=False):
        return
    raise torch.cuda.OutOfMemoryError(
        reason
        or "another process ran out of memory with 1 sample per micro-batch (its error says "
        "where); every process stops with it"
    )


def give_up(module: GuardedModule, message: str) -> None:
    """Stop now with one process; with several, note ``message`` and keep stepping without
    work until :func:`stop_together` stops them all."""
    trainer = lightning_private.attached_trainer(module)
    if trainer is None or trainer.world_size < 2:
        raise torch.cuda.OutOfMemoryError(message)
    module.oom_state.gave_up = message
    log.error(
        "process %d: %s Its steps run without work until every process stops at the end of "
        "this epoch.",
        trainer.global_rank,
        message,
    )
