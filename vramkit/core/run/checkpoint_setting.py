"""A file named by a setting (``ckpt_path``, ``init_from``, ``teacher.checkpoint``), read safely,
or refused as that setting's mistake.

Every entry point reads the files its user hands in through `vramkit.core.io.safe_load` (nothing
in them runs code); a file that cannot be read that way is the setting's mistake: `ConfigError`,
which ``refusals_as_messages`` prints as one line (exit 2) and which withdraws the run folder
claimed for the call, so that a refused file leaves no folder behind.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vramkit.core.config.schema import ConfigError
from vramkit.core.io.checkpoint_io import read_checkpoint
from vramkit.core.io.safe_load import UnreadableCheckpointError, load_weights_only


def checkpoint_setting(key: str, path: str | Path, *, mmap: bool = True) -> dict[str, Any]:
    """The Lightning checkpoint that setting ``key`` names (`read_checkpoint`); `ConfigError`
    naming ``key`` when it is missing, unreadable, not a checkpoint, or would run code."""
    try:
        return read_checkpoint(path, mmap=mmap)
    except UnreadableCheckpointError as error:
        raise ConfigError(f"{key}: {error}", (key,)) from None


def weights_setting(key: str, path: str | Path) -> Any:
    """Whatever ``torch.save`` wrote to the file that setting ``key`` names (a weights file, a
    checkpoint of any layout), loaded weights-only (`load_weights_only`); `ConfigError` naming
    ``key`` when it cannot be read that way."""
    try:
        return load_weights_only(path)
    except UnreadableCheckpointError as error:
        raise ConfigError(f"{key}: {error}", (key,)) from None
