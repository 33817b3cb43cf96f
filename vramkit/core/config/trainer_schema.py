"""The trainer keys a user types, checked before any work, and vramkit's defaults of them.

Lightning checks `max_epochs=abc` deep inside `fit` (a TypeError that never names the key), after
the run folder and the loggers exist. `check_trainer` checks the values of the keys that
conf/trainer/*.yaml set and users override, with their types and ranges, and names the file and
the override in one `ConfigError`. Keys it does not list (strategy nodes, plugins, anything a user
adds with `+trainer.…`) are left to Lightning.

`TrainerSettings` is also the one place of the defaults vramkit gives those keys:
conf/trainer/default.yaml says ``???`` for them and reads them from here
(`vramkit.core.config.component_settings.LIBRARY_SETTINGS`). A key the YAML fills from the
profile (precision, accumulation, machines) or leaves to Lightning (max_steps, sync_batchnorm)
has Lightning's own default here, ``Trainer.__init__`` of lightning/pytorch/trainer/trainer.py,
as the page of keys shows it.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from omegaconf import DictConfig, OmegaConf
from pydantic import AfterValidator, Field

from vramkit.core.config.schema import choice_problem
from vramkit.core.config.settings import Settings

PRECISIONS = (
    "16-mixed",
    "bf16-mixed",
    "16-true",
    "bf16-true",
    "32-true",
    "64-true",
    "transformer-engine",
    "transformer-engine-float16",
)
"""The precision values Lightning 2.x accepts (`_PRECISION_INPUT_STR`)."""


def _lightning_precision(value: str) -> str:
    # A str checked against the list rather than a Literal: a number (trainer.precision=16) is
    # then refused as "expected str, got 16", which says what to type.
    if value not in PRECISIONS:
        raise ValueError(choice_problem(value, PRECISIONS))
    return value


def _wall_time(value: str | None) -> str | None:
    if value is not None and re.fullmatch(r"\d+:\d+:\d+:\d+", value) is None:
        raise ValueError(f"expected DD:HH:MM:SS (e.g. 00:12:00:00 for 12 hours), got {value!r}")
    return value


class TrainerSettings(Settings):
    """Typed values of the trainer keys in conf/trainer/*.yaml, with vramkit's defaults."""

    max_epochs: int | None = Field(10, ge=-1)
    """Training length in epochs (a task sets its own); -1 with max_steps -1 trains until
    stopped."""
    max_steps: int = Field(-1, ge=-1)
    """Training length in optimizer steps; -1: no limit (Lightning's default)."""
    max_time: Annotated[str | None, AfterValidator(_wall_time)] = None
    """Stop (with a checkpoint) after this wall time, "DD:HH:MM:SS"; null: no limit."""
    precision: Annotated[str, AfterValidator(_lightning_precision)] = "32-true"
    """Lightning's precision, one of `PRECISIONS` (conf/trainer takes the profile's)."""
    accumulate_grad_batches: int = Field(1, ge=1)
    """Micro-batches per optimizer step (conf/trainer takes the profile's)."""
    check_val_every_n_epoch: int | None = Field(1, ge=1)
    """Validate after every n training epochs."""
    log_every_n_steps: int = Field(10, ge=1)
    """How often train/ metrics reach the loggers (steps)."""
    gradient_clip_val: float | None = Field(None, ge=0.0)
    """Clip gradients to this norm; null: no clipping."""
    deterministic: bool | Literal["warn"] = False
    """true forces deterministic kernels (slower); "warn" only warns about the others."""
    enable_model_summary: bool = False
    """Lightning's own summary; vramkit's callbacks.model_summary prints one with counted FLOPs."""
    num_sanity_val_steps: int = Field(0, ge=-1)
    """Validation batches before training (-1: all); 0, as the planner, not a sanity pass,
    guards validation memory."""
    num_nodes: int = Field(1, ge=1)
    """Machines (conf/trainer takes the profile's)."""
    sync_batchnorm: bool = False
    """BatchNorm statistics over every process."""


def check_trainer(trainer: DictConfig) -> TrainerSettings:
    """The trainer config's typed keys, or a `ConfigError` naming each bad one with its file."""
    # Unresolved: the profile's interpolations (${hw.…}) are checked when the profile
    # settles; what is checked here is what the files and the command line set as values.
    values: dict[str, Any] = {
        key: value
        for key, value in OmegaConf.to_container(trainer, resolve=False).items()
        if key in TrainerSettings.model_fields and not (isinstance(value, str) and "${" in value)
    }
    return TrainerSettings.from_node(values, node="trainer")
