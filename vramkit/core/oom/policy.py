"""What a process does after an out-of-memory error in a guarded step."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Action(enum.Enum):
    """The next move of a guarded step after a failed attempt."""

    SPLIT = "split"  # redo the unfinished samples in smaller micro-batches
    LAST_RESORT = "last_resort"  # checkpoint, reload the optimizer state from it, then SPLIT
    GIVE_UP = "give_up"  # one sample per micro-batch still does not fit


@dataclass(frozen=True)
class Decision:
    """An :class:`Action` and the micro-batch size (samples) that the redo and later steps use."""

    action: Action
    micro_batch: int


def halve(micro_batch: int) -> int:
    """Half of ``micro_batch`` samples, rounded up, so 5 → 3 → 2 → 1."""
    return max(1, (micro_batch + 1) // 2)


def decide(micro_batch: int, failures_so_far: int, *, last_resort: bool = True) -> Decision:
    """The next move of a step whose attempt with ``micro_batch`` samples per micro-batch ran
    out of memory on this process.

    ``failures_so_far`` counts the earlier failed attempts of the same step. The first failure
    halves the micro-batch; a later one is the last resort when ``last_resort`` is set
    (training), and halves as well; one sample that does not fit is the end.

    Every process decides alone: a split or a last resort changes nothing another process
    waits for (a guarded step's micro-batches run without collectives, and the gradients are
    all-reduced once, after the step), so processes may run different micro-batch sizes.
    Only giving up concerns them all; see :mod:`vramkit.core.oom.give_up`.
    """
    if micro_batch <= 1:
        return Decision(Action.GIVE_UP, micro_batch)
    action = Action.LAST_RESORT if last_resort and failures_so_far >= 1 else Action.SPLIT
    return Decision(action, halve(micro_batch))
