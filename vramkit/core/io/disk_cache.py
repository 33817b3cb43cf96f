"""An on-disk cache of deterministic per-sample arrays, such as validation inputs and targets.

Validation images go through a fixed resize and their DBNet target maps never change, yet a
loader recomputes both on every pass. :class:`ValidationCache` keeps them on disk instead: one
file per sample, named by a content key (see :func:`content_key`: a hash of the source files'
bytes and of every parameter the arrays depend on), read back as memory-mapped numpy arrays.

Entry file (``<key>.vkc``)::

    8 bytes   magic b"VKCACHE\\0"
    8 bytes   header length, little-endian uint64
    header    UTF-8 JSON: format, key, payload bytes, CRC-32 of the payload, and for every array
              its name, dtype, shape and offset in the payload
    padding   to a multiple of 64 bytes
    payload   the arrays' bytes, each starting at a multiple of 64 bytes

Guarantees:

- An entry is served only when its size, format, key and payload checksum all match; a
  truncated, corrupt or stale entry is deleted, counted in ``rejected`` and reported as a miss,
  so the caller recomputes it.
- Writes go to a hidden temporary file in the cache folder and are renamed into place, so
  readers see a whole entry or none, and several loader workers writing the same key at once is
  harmless (the contents are identical; the last rename wins). No fsync: losing an entry to a
  power cut costs one recomputation, and a torn file fails the checksum.
- Least recently used entries (a hit refreshes the file's modification time) are evicted so that
  the folder stays under ``max_bytes``; an entry larger than the cap on its own is not stored.
- The cache never stops a run: a folder that cannot be read or written (full disk, wrong
  permissions) turns reads into misses and writes into no-ops, with one warning per process.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import logging
import os
import struct
import sys
import time
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import Field

from vramkit.core.config.settings import ConfigPath, Settings
from vramkit.core.io.checkpoint_io import is_partial_write, partial_write_path

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
ENTRY_SUFFIX = ".vkc"
DEFAULT_MAX_GIB = 5.0
GIB = 2**30
_MAGIC = b"VKCACHE\0"
_LENGTH = struct.Struct("<Q")
_ALIGN = 64  # payload and array offsets: cache-line aligned, and aligned for every dtype
_MAX_HEADER_BYTES = 1 << 20
# A temporary file untouched for this long belongs to a killed writer, not a running one.
_ABANDONED_AFTER_S = 3600.0


def content_key(*parts: bytes | str | int | float | Mapping[str, Any] | Sequence[Any]) -> str:
    """Hex SHA-256 of ``parts``: raw bytes as they are, anything else as canonical JSON.

    Each part is length-prefixed, so ``("ab", "c")`` and ``("a", "bc")`` give different keys.
    """
    digest = hashlib.sha256()
    for part in parts:
        if isinstance(part, bytes | bytearray | memoryview):
            data = bytes(part)
        else:
            data = json.dumps(part, sort_keys=True, separators=(",", ":")).encode("utf-8")
        digest.update(_LENGTH.pack(len(data)))
        digest.update(data)
    return digest.hexdigest()


def _aligned(offset: int) -> int:
    return -(-offset // _ALIGN) * _ALIGN


@dataclass(frozen=True)
class CacheReport:
    """What a cache folder holds, and what this process's cache object did.

    ``hits`` … ``rejected`` count this process only: with loader workers, each worker keeps its
    own counts and the main process sees none of them.
    """

    directory: str
    entries: int
    size_bytes: int  # entries and unfinished writes on disk
    max_bytes: int
    partial_writes: int  # temporary files of writes in progress (or of killed writers)
    hits: int
    misses: int
    writes: int
    evictions: int
    rejected: int  # corrupt, truncated or stale entries deleted on read
    too_large: int  # entries not stored because they alone exceed max_bytes
    io_errors: int  # reads and writes the file system refused (served or stored nothing)

    @property
    def size_gib(self) -> float:
        """Size on disk in GiB."""
        return self.size_bytes / GIB

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready fields, sizes also in GiB."""
        result = asdict(self)
        result["size_gib"] = round(self.size_gib, 4)
        result["max_gib"] = round(self.max_bytes / GIB, 4)
        return result

    def describe(self) -> str:
        """One line for a log: entries, size against the cap, folder, and this process's counts
        when it did any work (loader workers keep theirs)."""
        line = (
            f"{self.entries} entries, {self.size_gib:.3f} GiB of {self.max_bytes / GIB:.2f} GiB "
            f"in {self.directory}"
        )
        counts = (self.hits, self.misses, self.writes, self.evictions, self.rejected)
        if any(counts):
            line += (
                f" (this process: {self.hits} hits, {self.misses} misses, {self.writes} writes, "
                f"{self.evictions} evicted, {self.rejected} rejected)"
            )
        return line


class ValidationCacheSettings(Settings):
    """A validation cache as a config states it (``data.val_cache`` of the text detection data)."""

    enabled: bool = True
    """False: no cache; every validation pass recomputes its inputs and targets."""
    dir: ConfigPath | None = None
    """The cache folder; runs share it (entries are keyed by file content and parameters)."""
    max_gib: float = Field(DEFAULT_MAX_GIB, gt=0)
    """Size cap of the folder (GiB); least recently used entries are evicted beyond it."""

    def cross_field_problems(self) -> list[tuple[str, str]]:
        """An enabled cache needs its folder (run by the config checks)."""
        if self.enabled and self.dir is None:
            return [("dir", "missing: an enabled cache needs a folder (or set enabled: false)")]
        return []

    def build(self) -> ValidationCache | None:
        """The cache these settings describe, or None when it is off."""
        if not self.enabled or self.dir is None:
            return None
        return ValidationCache.with_max_gib(self.dir, self.max_gib)


class _CacheCap(Settings):
    max_bytes: int = Field(gt=0)
    """Size cap of the cache folder (bytes)."""


@dataclass(frozen=True)
class _DiskEntry:
    path: Path
    size: int
    last_used: float


class ValidationCache:
    """Named numpy arrays per key, memory-mapped from ``directory``, at most ``max_bytes`` on disk.

    The object holds only the folder, the cap and counters, so it pickles cheaply into every
    DataLoader worker. See the module notes for the file format and the guarantees.
    """

    def __init__(self, directory: str | os.PathLike[str], *, max_bytes: int) -> None:
        cap = _CacheCap.from_config(
            {"max_bytes": max_bytes}, key_prefix="", title="invalid ValidationCache"
        )
        self.directory = Path(directory)
        self.max_bytes = cap.max_bytes
        self.hits = 0
        self.misses = 0
        self.writes = 0
        self.evictions = 0
        self.rejected = 0
        self.too_large = 0
        self.io_errors = 0
        self._warned_io = False

    @classmethod
    def with_max_gib(
        cls, directory: str | os.PathLike[str], max_gib: float = DEFAULT_MAX_GIB
    ) -> ValidationCache:
        """A cache capped at ``max_gib`` GiB."""
        settings = ValidationCacheSettings.from_config(
            {"dir": directory, "max_gib": max_gib},
            key_prefix="",
            title="invalid ValidationCache",
        )
        return cls(directory, max_bytes=int(settings.max_gib * GIB))

    def path_for(self, key: str) -> Path:
        """The entry file of ``key`` (a hex digest, e.g. from :func:`content_key`)."""
        if not key or not all(c in "0123456789abcdef" for c in key):
            raise ValueError(f"a cache key must be lowercase hex digits, got {key!r}")
        return self.directory / f"{key}{ENTRY_SUFFIX}"

    def get(self, key: str) -> dict[str, np.ndarray] | None:
        """The arrays stored under ``key`` (read-only, memory-mapped), or None.

        None means: never stored, evicted, or rejected (corrupt, truncated, stale), which
        also deletes the entry.
        """
        path = self.path_for(key)
        try:
            handle = path.open("rb")
        except FileNotFoundError:
            self.misses += 1
            return None
        except OSError as error:
            self._io_problem("read", path, error)
            self.misses += 1
            return None
        with handle:
            try:
                arrays = _read_entry(handle, key)
            except _BadEntry as problem:
                log.warning("validation cache: %s: %s; recomputing it", path, problem)
                self.rejected += 1
                self.misses += 1
                _unlink_if_same(path, os.fstat(handle.fileno()))
                return None
        self.hits += 1
        # The last use orders the evictions. An entry evicted meanwhile by another worker is
        # gone from the folder, but the arrays mapped from it stay readable.
        with contextlib.suppress(OSError):
            os.utime(path)
        return arrays

    def put(self, key: str, arrays: Mapping[str, np.ndarray]) -> bool:
        """Store ``arrays`` under ``key``, evicting least recently used entries to make room.

        Returns False, storing nothing, when the entry alone would exceed ``max_bytes`` or the
        folder cannot be written.
        """
        path = self.path_for(key)
        header, payload = _pack(key, arrays)
        header_bytes = json.dumps(header, separators=(",", ":")).encode("utf-8")
        payload_start = _aligned(len(_MAGIC) + _LENGTH.size + len(header_bytes))
        size = payload_start + payload.nbytes
        if size > self.max_bytes:
            self.too_large += 1
            log.warning(
                "validation cache: an entry of %.1f MiB exceeds the cap of %.1f MiB; not stored",
                size / 2**20,
                self.max_bytes / 2**20,
            )
            return False
        temporary = partial_write_path(path)
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._evict(room_for=size, keep=path)
            with temporary.open("xb") as handle:
                handle.write(_MAGIC)
                handle.write(_LENGTH.pack(len(header_bytes)))
                handle.write(header_bytes)
                handle.write(bytes(payload_start - handle.tell()))
                handle.write(payload.data)
            os.replace(temporary, path)
        except OSError as error:
            with contextlib.suppress(OSError):
                temporary.unlink(missing_ok=True)
            self._io_problem("write", path, error)
            return False
        except BaseException:
            temporary.unlink(missing_ok=True)
            raise
        self.writes += 1
        return True

    def _io_problem(self, action: str, path: Path, error: OSError) -> None:
        self.io_errors += 1
        if not self._warned_io:
            self._warned_io = True
            log.warning(
                "validation cache: cannot %s %s (%s); going on without the cache where it fails",
                action,
                path,
                error,
            )

    def get_or_compute(
        self, key: str, compute: Callable[[], Mapping[str, np.ndarray]]
    ) -> dict[str, np.ndarray]:
        """The cached arrays of ``key``, or ``compute()``'s, which are stored on the way."""
        cached = self.get(key)
        if cached is not None:
            return cached
        arrays = dict(compute())
        self.put(key, arrays)
        return arrays

    def _scan(self) -> tuple[list[_DiskEntry], int, int]:
        """Entries (oldest use first), bytes of unfinished writes, and their count."""
        entries: list[_DiskEntry] = []
        partial_bytes = partial_count = 0
        now = time.time()
        try:
            listing = list(os.scandir(self.directory))
        except OSError:
            return [], 0, 0  # not created yet (or unreadable: then nothing can be served either)
        for item in listing:
            try:
                stat = item.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue  # evicted or renamed by another worker during the scan
            if is_partial_write(Path(item.name)):
                if now - stat.st_mtime > _ABANDONED_AFTER_S:
                    with contextlib.suppress(OSError):
                        Path(item.path).unlink(missing_ok=True)
                else:
                    partial_bytes += stat.st_size
                    partial_count += 1
            elif item.name.endswith(ENTRY_SUFFIX) and item.is_file(follow_symlinks=False):
                entries.append(_DiskEntry(Path(item.path), stat.st_size, stat.st_mtime))
        entries.sort(key=lambda entry: entry.last_used)
        return entries, partial_bytes, partial_count

    def _evict(self, *, room_for: int, keep: Path | None) -> None:
        entries, partial_bytes, _ = self._scan()
        total = partial_bytes + sum(entry.size for entry in entries if entry.path != keep)
        for entry in entries:
            if total + room_for <= self.max_bytes:
                break
            if entry.path == keep:
                continue  # about to be replaced by the same key's new file
            entry.path.unlink(missing_ok=True)
            total -= entry.size
            self.evictions += 1

    def enforce_cap(self) -> None:
        """Evict least recently used entries until the folder is under ``max_bytes``.

        Needed only when the cap was lowered: every ``put`` already makes room.
        """
        self._evict(room_for=0, keep=None)

    def report(self) -> CacheReport:
        """The storage report: what is on disk now, and this process's counts."""
        entries, partial_bytes, partial_count = self._scan()
        return CacheReport(
            directory=str(self.directory),
            entries=len(entries),
            size_bytes=partial_bytes + sum(entry.size for entry in entries),
            max_bytes=self.max_bytes,
            partial_writes=partial_count,
            hits=self.hits,
            misses=self.misses,
            writes=self.writes,
            evictions=self.evictions,
            rejected=self.rejected,
            too_large=self.too_large,
            io_errors=self.io_errors,
        )


class _BadEntry(Exception):
    """An entry that must not be served (the message says why)."""


def _pack(key: str, arrays: Mapping[str, np.ndarray]) -> tuple[dict[str, Any], np.ndarray]:
    """The header fields and the payload (uint8, padding included) of an entry."""
    specs = []
    placed = []
    end = 0
    for name, value in arrays.items():
        if not isinstance(name, str) or not name:
            raise ValueError(f"array names must be non-empty strings, got {name!r}")
        array = np.asarray(value)
        if array.dtype.hasobject:
            raise ValueError(f"array {name!r} holds Python objects; only numeric data is cached")
        offset = _aligned(end)
        specs.append(
            {"name": name, "dtype": array.dtype.str, "shape": list(array.shape), "offset": offset}
        )
        placed.append((offset, array))
        end = offset + array.nbytes
    payload = np.zeros(_aligned(end), dtype=np.uint8)
    for offset, array in placed:
        payload[offset : offset + array.nbytes] = (
            np.ascontiguousarray(array).reshape(-1).view(np.uint8)
        )
    header = {
        "format": FORMAT_VERSION,
        "key": key,
        "payload_bytes": int(payload.nbytes),
        "crc32": zlib.crc32(payload),
        "arrays": specs,
    }
    return header, payload


def _read_entry(handle: Any, key: str) -> dict[str, np.ndarray]:
    """Validate an open entry file and map its arrays; raises _BadEntry when it must not serve."""
    size = os.fstat(handle.fileno()).st_size
    prefix = handle.read(len(_MAGIC) + _LENGTH.size)
    if len(prefix) < len(_MAGIC) + _LENGTH.size or prefix[: len(_MAGIC)] != _MAGIC:
        raise _BadEntry("not a cache entry (bad magic or truncated)")
    (header_length,) = _LENGTH.unpack(prefix[len(_MAGIC) :])
    if header_length > _MAX_HEADER_BYTES:
        raise _BadEntry(f"header length {header_length} is implausible")
    try:
        header = json.loads(handle.read(header_length).decode("utf-8"))
        version, stored_key = header["format"], header["key"]
        payload_bytes, expected_crc = int(header["payload_bytes"]), int(header["crc32"])
        specs = [
            (
                str(a["name"]),
                np.dtype(a["dtype"]),
                tuple(int(n) for n in a["shape"]),
                int(a["offset"]),
            )
            for a in header["arrays"]
        ]
    except (ValueError, KeyError, TypeError) as error:
        raise _BadEntry(f"unreadable header ({error})") from None
    if version != FORMAT_VERSION:
        raise _BadEntry(f"format {version}, this code reads {FORMAT_VERSION}")
    if stored_key != key:
        raise _BadEntry(f"holds key {stored_key!r}, not {key!r}")
    payload_start = _aligned(len(_MAGIC) + _LENGTH.size + header_length)
    if size != payload_start + payload_bytes:
        raise _BadEntry(f"{size} bytes on disk, {payload_start + payload_bytes} expected")
    if payload_bytes == 0:
        payload = np.zeros(0, dtype=np.uint8)
    else:
        payload = np.memmap(handle, dtype=np.uint8, mode="r", offset=payload_start)
    if zlib.crc32(payload) != expected_crc:
        raise _BadEntry("checksum mismatch (corrupt payload)")
    arrays = {}
    for name, dtype, shape, offset in specs:
        nbytes = dtype.itemsize * int(np.prod(shape, dtype=np.int64))
        if offset < 0 or offset + nbytes > payload_bytes:
            raise _BadEntry(f"array {name!r} lies outside the payload")
        arrays[name] = np.ndarray(shape, dtype=dtype, buffer=payload, offset=offset)
    return arrays


def _unlink_if_same(path: Path, opened: os.stat_result) -> None:
    # Another worker may have replaced the bad file with a good one since it was opened.
    with contextlib.suppress(OSError):
        current = path.stat()
        if (current.st_ino, current.st_dev) == (opened.st_ino, opened.st_dev):
            path.unlink(missing_ok=True)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m vramkit.core.io.disk_cache DIR``: print the storage report as JSON."""
    parser = argparse.ArgumentParser(
        prog="python -m vramkit.core.io.disk_cache",
        description="Storage report of a validation cache folder (one JSON line).",
    )
    parser.add_argument("directory", type=Path, help="the cache folder (data.val_cache.dir)")
    parser.add_argument(
        "--max-gib", type=float, default=DEFAULT_MAX_GIB, help="the cap to report against (GiB)"
    )
    parser.add_argument(
        "--enforce",
        action="store_true",
        help="evict least recently used entries until the folder is under the cap",
    )
    args = parser.parse_args(argv)
    if not args.directory.is_dir():
        print(f"error: no cache folder {args.directory}", file=sys.stderr)
        return 2
    cache = ValidationCache.with_max_gib(args.directory, args.max_gib)
    if args.enforce:
        cache.enforce_cap()
    print(json.dumps(cache.report().as_dict()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
