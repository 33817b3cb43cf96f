"""The one way vramkit opens a ``torch.save`` file (checkpoint, weights file) or a NumPy array
file: nothing in the file can run code.

A ``torch.save`` file is a pickle, and unpickling a pickle calls whatever functions it names: a
``.ckpt`` whose pickle names ``os.system`` runs a command the moment it is opened, before any
check of its contents. ``torch.load(weights_only=True)`` unpickles with torch's restricted
unpickler instead (``torch/_weights_only_unpickler.py``): tensors, storages, the built-in
containers and primitive types, and the globals allow-listed with
``torch.serialization.safe_globals``; any other global is refused before it is called.

``weights_only=True`` is always passed explicitly: ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1`` turns
a ``torch.load`` that leaves it unset into an unrestricted one (``torch/serialization.py``,
``load``: "can only override if callsite did not explicitly set weights_only"), and Lightning's
own load (``lightning/fabric/utilities/cloud_io.py``, ``_load``) leaves it unset unless told.

`SAFE_GLOBALS` is what vramkit allows beyond torch's defaults. Its own checkpoints need nothing
more (checked: a ``debug=smoke`` run's ``last.ckpt`` and best checkpoint list no unsafe global in
``torch.serialization.get_unsafe_globals_in_checkpoint``; callbacks, random state, loops,
optimizer and hyper-parameters are tensors, dicts, lists, strings and numbers); the path classes
are there because ``save_hyperparameters`` records any ``pathlib.Path`` a LightningModule is
given (a weights file passed from Python), and building a path runs nothing.

NumPy's ``.npy`` files hold a pickle when their array holds Python objects: `load_array` reads
them with ``allow_pickle=False`` (NumPy's default since 1.16.3, passed explicitly all the same),
and refuses such a file in one line rather than with NumPy's traceback.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch

SAFE_GLOBALS: tuple[type, ...] = (
    pathlib.PosixPath,
    pathlib.PurePosixPath,
    pathlib.WindowsPath,
    pathlib.PureWindowsPath,
)
"""Globals a vramkit file may name besides torch's weights-only defaults (see the module doc)."""

_GLOBAL_IN_MESSAGE = re.compile(r"GLOBAL ([\w.]+)")
"""How torch's weights-only refusal names the global it blocked ("Unsupported global: GLOBAL
posix.system ...")."""


class UnreadableCheckpointError(ValueError):
    """A file that cannot be loaded as a checkpoint; the message says why, in one line."""


class UnsafeFileError(UnreadableCheckpointError):
    """A file whose unpickling would call code that no weights file needs; nothing was called."""


def load_weights_only(path: str | os.PathLike[str], *, mmap: bool = False) -> Any:
    """The object ``torch.save`` wrote to ``path``, loaded to CPU with ``weights_only=True``.

    ``mmap=True`` maps the file (tensors are read when touched; the file must be a zip archive,
    as every ``torch.save`` since torch 1.6 writes). Raises `UnsafeFileError` when the file names
    a global outside torch's defaults and `SAFE_GLOBALS` (its message names the global), and
    `UnreadableCheckpointError` for a missing, empty, unreadable or corrupt file.
    """
    path = Path(path).expanduser()
    check_readable_file(path)
    try:
        with torch.serialization.safe_globals(list(SAFE_GLOBALS)):
            return torch.load(path, map_location="cpu", mmap=mmap, weights_only=True)
    except Exception as error:  # torch raises UnpicklingError, RuntimeError, KeyError, ...
        blocked = _blocked_globals(path, error)
        if blocked:
            raise UnsafeFileError(
                f"{path} is refused: loading it would call {', '.join(blocked)}, which no "
                "checkpoint or weights file needs (vramkit loads them with weights_only=True; "
                "a file from a source you do not trust can run anything when unpickled)"
            ) from None
        raise UnreadableCheckpointError(
            f"{path} cannot be loaded ({type(error).__name__}: {_first_line(error)})"
        ) from None


def load_array(path: str | os.PathLike[str], *, mmap: bool = False) -> np.ndarray:
    """The array ``np.save`` wrote to ``path``, never unpickled (``allow_pickle=False``);
    ``mmap=True`` maps it read-only. Raises `UnsafeFileError` for a file that holds a pickle
    (an object array, or no ``.npy`` file at all) and `UnreadableCheckpointError` for a missing,
    empty or corrupt one."""
    path = Path(path).expanduser()
    check_readable_file(path)
    try:
        return np.load(path, mmap_mode="r" if mmap else None, allow_pickle=False)
    except ValueError as error:
        # NumPy's words for an object array (loaded, or memory-mapped) and for a pickle file
        if any(word in str(error) for word in ("pickle", "Object arrays", "Python objects")):
            raise UnsafeFileError(
                f"{path} is refused: it holds a pickle (Python objects, which can run code when "
                "loaded), and vramkit's array files hold numbers only"
            ) from None
        raise UnreadableCheckpointError(f"{path} cannot be loaded ({_first_line(error)})") from None
    except (OSError, EOFError) as error:
        raise UnreadableCheckpointError(f"{path} cannot be loaded ({_first_line(error)})") from None


def check_readable_file(path: Path) -> None:
    """Raise `UnreadableCheckpointError` unless ``path`` is a non-empty, readable file."""
    if not path.exists():
        raise UnreadableCheckpointError(f"no file at {path}")
    if path.is_dir():
        raise UnreadableCheckpointError(f"{path} is a folder, not a checkpoint file")
    if path.stat().st_size == 0:
        raise UnreadableCheckpointError(f"{path} is empty (0 bytes)")
    if not os.access(path, os.R_OK):
        raise UnreadableCheckpointError(f"{path} cannot be read (permission denied)")


def _blocked_globals(path: Path, error: Exception) -> list[str]:
    """The globals of ``path`` that the restricted unpickler refused ([] for other errors)."""
    named = _GLOBAL_IN_MESSAGE.findall(str(error))
    if not named:
        return []
    allowed = {f"{kind.__module__}.{kind.__qualname__}" for kind in SAFE_GLOBALS}
    # Lists every unsafe global without unpickling (zip archives only; else torch's one name).
    with contextlib.suppress(Exception):
        listed = torch.serialization.get_unsafe_globals_in_checkpoint(path)
        named = [name for name in listed if name not in allowed] or named
    return list(dict.fromkeys(named))


def _first_line(error: Exception) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else ""
