"""The batch sizes a task states (``batch_size_defaults``): what ``auto`` means without a GPU
budget to plan, and the effective batch the planner keeps with accumulation."""

from __future__ import annotations

from omegaconf import DictConfig

from vramkit.core.hardware.profile import ProfileError

DEFAULTS_KEY = "batch_size_defaults"
"""Top-level config key of the task's stated batch sizes (``train``, ``val``)."""


def task_batch_default(cfg: DictConfig, phase: str) -> int | None:
    """The task's stated batch size for `phase` ("train" or "val"): `batch_size_defaults.<phase>`.

    None when the task states none; a `ProfileError` when it states something other than a
    positive int.
    """
    defaults = cfg.get(DEFAULTS_KEY)
    value = defaults.get(phase) if isinstance(defaults, DictConfig) else None
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
        raise ProfileError(
            f"{DEFAULTS_KEY}.{phase} must be a positive int, got {value!r}", keys=(phase,)
        )
    return value
