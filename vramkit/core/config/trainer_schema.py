"""The trainer keys a user types, checked before any work.

Lightning checks `max_epochs=abc` deep inside `fit` (a TypeError that never names the key), after
the run folder and the loggers exist. `check_trainer` checks the values of the keys that
conf/trainer/*.yaml set and users override, with their types and ranges, and names the file and
the override in one `ConfigError`. Keys it does not list (strategy nodes, plugins, anything a user
adds with `+trainer.…`) are left to Lightning.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from omegaconf import DictConfig, OmegaConf

from vramkit.core.config.schema import ConfigError, check_settings
from vramkit.core.config.source import source_of

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


@dataclass
class TrainerSettings:
    """Typed values of the trainer keys in conf/trainer/*.yaml."""

    max_epochs: int | None = field(default=None, metadata={"ge": -1})
    """Training length in epochs; -1 with max_steps -1 trains until stopped."""
    max_steps: int = field(default=-1, metadata={"ge": -1})
    """Training length in optimizer steps; -1: no limit."""
    max_time: str | None = None
    """Wall-time limit "DD:HH:MM:SS"; null: none."""
    precision: str = field(default="32-true", metadata={"choices": PRECISIONS})
    """Lightning's precision."""
    accumulate_grad_batches: int = field(default=1, metadata={"ge": 1})
    """Micro-batches per optimizer step."""
    check_val_every_n_epoch: int | None = field(default=1, metadata={"ge": 1})
    """Validate after every n training epochs."""
    log_every_n_steps: int = field(default=50, metadata={"ge": 1})
    """How often training metrics reach the loggers."""
    gradient_clip_val: float | None = field(default=None, metadata={"ge": 0.0})
    """Clip gradients to this norm; null: no clipping."""
    num_sanity_val_steps: int = field(default=2, metadata={"ge": -1})
    """Validation batches before training; -1: all."""
    num_nodes: int = field(default=1, metadata={"ge": 1})
    """Machines."""
    sync_batchnorm: bool = False
    """BatchNorm statistics over every process."""


def check_trainer(trainer: DictConfig) -> TrainerSettings:
    """The trainer config's typed keys, or a `ConfigError` naming each bad one with its file."""
    known = {f.name for f in fields(TrainerSettings)}
    # Unresolved: the profile's interpolations (${hw.…}) are checked when the profile
    # settles; what is checked here is what the files and the command line set as values.
    values: dict[str, Any] = {
        key: value
        for key, value in OmegaConf.to_container(trainer, resolve=False).items()
        if key in known and not (isinstance(value, str) and "${" in value)
    }
    settings = check_settings(
        values, TrainerSettings, key_prefix="trainer.", source=source_of("trainer")
    )
    if settings.max_time is not None:
        _check_max_time(settings.max_time)
    return settings


def _check_max_time(value: str) -> None:
    parts = value.split(":")
    if len(parts) != 4 or not all(part.isdigit() for part in parts):
        source = source_of("trainer")
        override = source.override_for("trainer.max_time")
        where = f" (override {override})" if override else ""
        raise ConfigError(
            f"trainer.max_time in {source.file}{where}: expected DD:HH:MM:SS "
            f"(e.g. 00:12:00:00 for 12 hours), got {value!r}",
            ("max_time",),
        )
