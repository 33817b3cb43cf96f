"""The run's seed (``seed`` in ``conf/train.yaml``), checked before any work.

Lightning's ``seed_everything`` raises a bare ``ValueError`` for ``seed=abc`` or a seed outside
numpy's range, after the run folder, the log and the hardware plan: a traceback for a typo.
"""

from __future__ import annotations

from omegaconf import DictConfig
from pydantic import Field

from vramkit.core.config.settings import Settings
from vramkit.core.config.source import ConfigSource, command_line_overrides, override_key

MAX_SEED = 2**32 - 1
"""The largest seed numpy accepts (a uint32), which ``seed_everything`` passes it."""


class SeedSettings(Settings):
    """The run's top-level ``seed`` key."""

    seed: int | None = Field(42, ge=0, le=MAX_SEED)
    """Seeds python, numpy and torch, also in loader workers; None for a random run."""


def check_seed(cfg: DictConfig) -> int | None:
    """``cfg.seed`` as an int (or None), or a `ConfigError` naming the key, file and override."""
    overrides = tuple(o for o in command_line_overrides() if override_key(o) == "seed")
    settings = SeedSettings.from_config(
        {"seed": cfg.get("seed")},
        key_prefix="",
        source=ConfigSource("conf/train.yaml", overrides),
        title="invalid seed",
    )
    return settings.seed
