"""Import an optional extra with a message that says which install brings it."""

from __future__ import annotations

import importlib
from types import ModuleType


def import_optional(name: str, *, extra: str, purpose: str) -> ModuleType:
    """``import name``, or an ImportError saying that ``purpose`` needs ``vramkit[extra]``."""
    try:
        return importlib.import_module(name)
    except ImportError as error:
        raise ImportError(
            f"{purpose} needs the optional package '{name}', which is not installed: "
            f"pip install 'vramkit[{extra}]' (or pip install {name})"
        ) from error
