"""The batch sizes a task states (``batch_size_defaults``): what ``auto`` means without a GPU
budget to plan, and the effective batch the planner keeps with accumulation."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from vramkit.core.hardware.profile import ProfileError
from vramkit.core.planner.request import DEFAULTS_KEY


def task_batch_default(config: Mapping[str, Any], phase: str) -> int | None:
    """The task's stated batch size for `phase` ("train" or "val"): `batch_size_defaults.<phase>`
    of the run's `config` (a composed config is a mapping).

    None when the task states none; a `ProfileError` when it states something other than a
    positive int.
    """
    defaults = config.get(DEFAULTS_KEY)
    value = defaults.get(phase) if isinstance(defaults, Mapping) else None
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
        raise ProfileError(
            f"{DEFAULTS_KEY}.{phase} must be a positive int, got {value!r}", keys=(phase,)
        )
    return value
