"""Free disk space before a checkpoint write, and a clear error when there is not enough.

A checkpoint write that runs out of space mid-stream ends, under ``torch.save``'s zip writer, in
``enforce fail ... unexpected pos`` with ENOSPC dozens of lines above; the user learns neither
which folder nor how much was missing. Here the space a checkpoint needs is estimated before the
write (`checkpoint_bytes`) and compared with what the folder's file system has free
(`check_free_space`); a write that still fails because the disk filled up is reported the same
way (`DiskFullError`).
"""

from __future__ import annotations

import errno
import shutil
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch

from vramkit.core.units import GIB, MIB

PICKLE_ALLOWANCE_BYTES = 16 * MIB
"""Added to the tensors' bytes for the pickled rest of a checkpoint (hyper-parameters, loop and
callback state) and the zip records around each storage: a checkpoint of a 1-layer model is
about 1 MiB beyond its tensors, so 16 MiB is a margin, not a measurement."""

FULL_BELOW_BYTES = 1 * MIB
"""A file system with less than this free after a failed write is taken to have run out."""


class DiskFullError(OSError):
    """Not enough free space for a write: names the folder, the free and the needed bytes."""

    def __init__(
        self,
        folder: Path,
        free_bytes: int,
        needed_bytes: int,
        what: str,
        target: Path | None = None,
    ) -> None:
        self.folder = folder
        self.free_bytes = free_bytes
        self.needed_bytes = needed_bytes
        super().__init__(
            errno.ENOSPC,
            f"not enough disk space for {what} in {folder}: {_gib(free_bytes)} free, "
            f"{_gib(needed_bytes)} needed. Free space there (older run folders, "
            "callbacks.checkpoint_retention.budget_gib), or write elsewhere with "
            f"paths.output_dir=...{_what_is_left(target)}",
        )

    def __str__(self) -> str:
        return self.strerror


def checkpoint_bytes(checkpoint: Any) -> int:
    """Bytes a ``torch.save`` of ``checkpoint`` writes, at most: every distinct tensor storage
    (saved whole, even for a view) plus `PICKLE_ALLOWANCE_BYTES`."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for tensor in _tensors(checkpoint):
        storage = tensor.untyped_storage()
        key = (storage.data_ptr(), storage.nbytes())
        if storage.nbytes() and key in seen:
            continue
        seen.add(key)
        total += storage.nbytes()
    return total + PICKLE_ALLOWANCE_BYTES


def free_bytes(folder: Path) -> int:
    """Free bytes on the file system of ``folder`` (or of its nearest existing parent)."""
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    return shutil.disk_usage(existing).free


def check_free_space(
    folder: Path, needed_bytes: int, what: str, target: Path | None = None
) -> None:
    """Raise `DiskFullError` unless ``folder``'s file system has ``needed_bytes`` free (for a
    write that would replace ``target``, when given: the message says whether one is kept)."""
    available = free_bytes(folder)
    if available < needed_bytes:
        raise DiskFullError(folder, available, needed_bytes, what, target)


def _what_is_left(target: Path | None) -> str:
    # A failed atomic write leaves the file it would have replaced, if there was one; a first
    # write leaves nothing, and saying "the previous checkpoint is intact" then misleads.
    if target is None:
        return ""
    if target.exists():
        return f"; the previous {target.name} is intact"
    return f"; there was no earlier {target.name}, so none is left"


def ran_out_of_space(error: BaseException, folder: Path) -> bool:
    """Whether a failed write failed because the disk is full: ENOSPC anywhere in the chain of
    causes, or (``torch.save``'s zip writer reports ENOSPC as a ``RuntimeError``) next to no free
    space left while the partial file still exists."""
    cause: BaseException | None = error
    while cause is not None:
        if isinstance(cause, OSError) and cause.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        cause = cause.__cause__ or cause.__context__
    return free_bytes(folder) < FULL_BELOW_BYTES


def _tensors(value: Any) -> Iterable[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from _tensors(item)
    elif isinstance(value, list | tuple | set):
        for item in value:
            yield from _tensors(item)


def _gib(size: int) -> str:
    if size >= GIB // 10:
        return f"{size / GIB:.2f} GiB"
    return f"{size / MIB:.1f} MiB"
