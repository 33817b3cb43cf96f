"""Import an optional extra with a message that says which install brings it."""

from __future__ import annotations

import importlib
from types import ModuleType

from vramkit.core.config.schema import ConfigError


class MissingExtraError(ConfigError, ImportError):
    """An optional package the run needs is not installed: one line naming the extra.

    A `ConfigError` (what the config asks for cannot run here), so a run refuses with its message
    alone, exit status 2 and no run folder, and `instantiate` raises it unwrapped; an
    `ImportError` for callers that catch that.
    """


def import_optional(name: str, *, extra: str, purpose: str) -> ModuleType:
    """``import name``, or a `MissingExtraError` saying ``purpose`` needs ``vramkit[extra]``."""
    try:
        return importlib.import_module(name)
    except ImportError as error:
        # Only the package itself missing is a missing extra; a broken install of it (one of
        # its own imports failing) keeps its traceback.
        if error.name is not None and error.name.split(".")[0] != name.split(".")[0]:
            raise
        raise MissingExtraError(
            f"{purpose} needs the optional package '{name}', which is not installed: "
            f"pip install 'vramkit[{extra}]' (or pip install {name})"
        ) from error
