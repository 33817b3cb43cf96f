"""Atomic file writes, and a Lightning ``CheckpointIO`` that writes every checkpoint that way.

A run killed while ``torch.save`` streams a 200 MB checkpoint must not leave a truncated
``last.ckpt`` that a later ``ckpt_path=...`` loads (or fails to load) as if it were whole. Every
write here goes to a hidden temporary file in the target's own folder (same file system, so the
rename cannot degrade into a copy), is flushed and fsync'ed, and only then renamed over the
target with ``os.replace``, which is atomic on POSIX and Windows. Readers see the old file or the
new one, never a mixture. A kill mid-write leaves only a ``.<name>.tmp-<pid>-<hex>`` file, which
`is_partial_write` recognises so that cleaners can remove it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import uuid
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import fsspec
import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO

from vramkit.core.compat import lightning_private
from vramkit.core.io.disk_space import (
    DiskFullError,
    check_free_space,
    checkpoint_bytes,
    free_bytes,
    ran_out_of_space,
)
from vramkit.core.io.safe_load import (
    SAFE_GLOBALS,
    UnreadableCheckpointError,
    check_readable_file,
    load_weights_only,
)

log = logging.getLogger(__name__)

_PARTIAL_WRITE = re.compile(r"^\..+\.tmp-\d+-[0-9a-f]{8}$")
_ZIP_START = b"PK\x03\x04"  # the first bytes of every zip archive, torch.save's format


def partial_write_path(target: Path) -> Path:
    """The temporary file a write of ``target`` goes to first: hidden, in the same folder."""
    return target.with_name(f".{target.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")


def is_partial_write(path: Path) -> bool:
    """Whether ``path`` is the temporary file of an atomic write (a leftover if no write runs)."""
    return _PARTIAL_WRITE.match(path.name) is not None


@contextlib.contextmanager
def atomic_output(target: str | os.PathLike[str], needed_bytes: int = 0) -> Iterator[IO[bytes]]:
    """Open a binary file whose content replaces ``target`` only if the block completes.

    On any exception the temporary file is removed and ``target`` keeps its previous content
    (or stays absent); a failure because the disk filled up is raised as `DiskFullError`
    (``needed_bytes``: what the whole write needs, for its message). The parent folder is
    created when missing.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    temporary = partial_write_path(target)
    try:
        with temporary.open("xb") as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, target)
    except BaseException as error:
        # Asked while the partial file still holds its space: after unlinking it, the disk is
        # no longer full.
        full = not isinstance(error, DiskFullError) and ran_out_of_space(error, target.parent)
        written = temporary.stat().st_size if temporary.exists() else 0
        temporary.unlink(missing_ok=True)
        if full:
            raise DiskFullError(
                target.parent,
                free_bytes(target.parent),
                max(needed_bytes, written),
                f"{target.name} (the write failed after {written} bytes)",
                target,
            ) from error
        raise
    _fsync_folder(target.parent)


def atomic_write_bytes(target: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` to ``target`` atomically (see `atomic_output`)."""
    with atomic_output(target) as handle:
        handle.write(data)


def atomic_link(source: str | os.PathLike[str], target: str | os.PathLike[str]) -> None:
    """Make ``target`` a second name of the file ``source`` (a hard link: one file on disk, no
    copy), replacing what ``target`` held atomically: the link is made under a temporary name
    and renamed over ``target``, so a reader sees the old file or the new one.

    ``source`` was written by `atomic_output`, which fsync'ed its data; the link adds only a
    folder entry, which the folder's own fsync makes durable (Linux fsync(2): "Calling fsync()
    does not necessarily ensure that the entry in the directory containing the file has also
    reached disk. For that an explicit fsync() on a file descriptor for the directory is also
    needed."). Writing over either name later replaces that name only (`atomic_output` renames
    a new file over it); deleting one leaves the other. Raises ``OSError`` where the file
    system has no hard links (FAT, some network shares) or ``source`` is not a local file.
    """
    target = Path(target)
    temporary = partial_write_path(target)
    os.link(source, temporary)
    try:
        os.replace(temporary, target)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    _fsync_folder(target.parent)


def _fsync_folder(folder: Path) -> None:
    # The rename itself lives in the folder's entry table: without this a power cut can lose it.
    # Windows cannot open a folder for fsync; its rename is already durable there.
    if os.name == "nt":
        return
    descriptor = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


class AtomicCheckpointIO(TorchCheckpointIO):
    """``torch.save`` checkpoints through `atomic_output`; loading and removal as Lightning does.

    Lightning writes every checkpoint (``ModelCheckpoint`` top-k and ``last.ckpt``,
    ``trainer.save_checkpoint``, vramkit's periodic checkpoints) through
    ``strategy.save_checkpoint`` → ``checkpoint_io.save_checkpoint``, so passing this plugin to
    the Trainer (``plugins=[AtomicCheckpointIO()]``) makes all of them atomic. The checkpoint is
    streamed to disk, not first serialised into a second in-memory copy. Remote paths (``s3://``
    and other fsspec URLs) keep Lightning's own transactional upload.

    Before each local write the space it needs (`checkpoint_bytes`: an atomic overwrite holds the
    old and the new file at once) is made: ``make_room(folder, needed_bytes)`` is called first when
    set (`CheckpointRetention` sets it to prune by its policy), then a folder still short of
    space raises `DiskFullError` before a byte is written.
    """

    def __init__(self) -> None:
        super().__init__()
        self.make_room: Callable[[Path, int], None] | None = None

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: str | Path, storage_options: Any | None = None
    ) -> None:
        if storage_options is not None:
            raise TypeError(
                f"{type(self).__name__} does not take storage_options; got {storage_options!r}"
            )
        if not lightning_private.is_local_path(path):
            super().save_checkpoint(checkpoint, path)
            return
        _, local_path = fsspec.core.url_to_fs(str(path))  # "file:///x" → "/x"
        target = Path(local_path)
        needed = checkpoint_bytes(checkpoint)
        if self.make_room is not None:
            self.make_room(target.parent, needed)
        check_free_space(target.parent, needed, f"checkpoint {target.name}", target)
        with atomic_output(target, needed_bytes=needed) as handle:
            torch.save(checkpoint, handle)
        log.debug("saved checkpoint %s", path)

    def load_checkpoint(
        self,
        path: str | Path,
        map_location: Any | None = None,
        weights_only: bool | None = None,
    ) -> dict[str, Any]:
        """Every checkpoint Lightning loads (``trainer.fit(ckpt_path=...)``, validate, test)
        is read as `read_checkpoint` reads it: weights only, whatever ``weights_only`` the
        caller passed (Lightning passes None, which ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD`` turns
        into an unrestricted load). Tensors come back on the CPU (``map_location`` is ignored):
        Lightning moves the states to the device when it restores them. Not memory-mapped, as
        Lightning loads it: the restored states are ordinary memory."""
        if not lightning_private.is_local_path(path):
            with torch.serialization.safe_globals(list(SAFE_GLOBALS)):
                return super().load_checkpoint(path, map_location, weights_only=True)
        _, local_path = fsspec.core.url_to_fs(str(path))
        return read_checkpoint(local_path, mmap=False)


def read_checkpoint(path: str | os.PathLike[str], *, mmap: bool = True) -> dict[str, Any]:
    """The Lightning checkpoint at ``path``, loaded through `load_weights_only` (nothing in the
    file runs code); ``mmap=True`` maps it (its tensors are read when touched).

    Everything that makes ``torch.load`` fail with a bare traceback (no file, a folder, zero
    bytes, a text file, half a file) raises `UnreadableCheckpointError` instead, as does a
    loadable file that is not a Lightning checkpoint (no ``state_dict``); a file whose pickle
    would call code raises `UnsafeFileError` (a subclass) naming what it would call.
    """
    path = Path(path).expanduser()
    check_readable_file(path)
    # torch.save writes a zip archive: anything else is not a checkpoint, and a zip without its
    # central directory (at the end of the file) is a copy or a write that stopped half way.
    if not zipfile.is_zipfile(path):
        with path.open("rb") as handle:
            truncated = handle.read(4) == _ZIP_START
        size = path.stat().st_size
        raise UnreadableCheckpointError(
            f"{path} is truncated ({size} bytes of a torch.save archive whose end is missing)"
            if truncated
            else f"{path} is not a PyTorch checkpoint ({size} bytes, not a torch.save archive)"
        )
    checkpoint = load_weights_only(path, mmap=mmap)
    if not isinstance(checkpoint, dict) or "state_dict" not in checkpoint:
        found = sorted(checkpoint)[:6] if isinstance(checkpoint, dict) else type(checkpoint)
        raise UnreadableCheckpointError(
            f"{path} is not a Lightning checkpoint (no state_dict; it holds {found})"
        )
    return checkpoint
