"""What to do after an out-of-memory error, decided the same way on every process."""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass


class Action(enum.Enum):
    """The next move of a guarded step after an attempt."""

    DONE = "done"  # no process ran out of memory: the step is complete
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


def decide(
    failed_here: bool,
    micro_batch: int,
    failures_so_far: int,
    any_process: Callable[[bool], bool],
    *,
    last_resort: bool = True,
) -> Decision:
    """Agree on the next move after one attempt of a step.

    ``failed_here`` says whether this process ran out of memory; ``any_process`` all-reduces
    that flag over the processes of the run (a logical OR; the identity with one process), so
    every process takes the same decision from the same inputs and no collective is left
    waiting. ``micro_batch`` (samples) and ``failures_so_far`` (earlier failed attempts of
    this step) are the same on every process because they only ever change through this
    function. The first failure of a step halves the micro-batch; a later one of the same
    step is the last resort when ``last_resort`` is set (training), and halves as well.
    """
    if not any_process(failed_here):
        return Decision(Action.DONE, micro_batch)
    if micro_batch <= 1:
        return Decision(Action.GIVE_UP, micro_batch)
    action = Action.LAST_RESORT if last_resort and failures_so_far >= 1 else Action.SPLIT
    return Decision(action, halve(micro_batch))
