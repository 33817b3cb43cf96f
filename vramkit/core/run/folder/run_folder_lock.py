"""One run per folder: an exclusive lock on ``<run>/.lock`` for as long as the run lives.

Two runs in one folder (``hydra.run.dir=<the same path>`` started twice, two resumes of one
checkpoint at once) overwrite each other's checkpoints, both write ``resume_1`` records and double
every metric line. The lock is ``flock`` on ``<run>/.lock``: the kernel releases it when the
process ends, however it ends, and NFS (Linux >= 2.6.12) emulates it across hosts. The file holds
the holder's pid, host and start time, so a second run is refused naming them.

A lock file left behind unlocked (its holder was killed) is taken over with a warning. So is a
locked one whose holder, on this host, no longer runs (a forked loader worker that outlived it
still holds the file): the file is replaced, and the lock is taken on the new one. Each taker
checks that the path still names the file it locked, so two takers never both win.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import json
import logging
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path

from vramkit.core.config.schema import ConfigError

LOCK_NAME = ".lock"
"""The lock file in a run folder."""

log = logging.getLogger(__name__)


class RunFolderBusyError(ConfigError):
    """Another live run holds the folder's lock; the message names it (pid, host, start time)."""


@dataclass
class RunFolderLock:
    """A held lock: the open file descriptor and the path it was taken on."""

    path: Path
    fd: int

    def release(self) -> None:
        """Remove the lock file (while still holding it) and let the lock go; idempotent."""
        if self.fd < 0:
            return
        with contextlib.suppress(OSError):
            if _same_file(self.path, self.fd):
                self.path.unlink()
        os.close(self.fd)
        self.fd = -1


def lock_run_folder(folder: Path) -> RunFolderLock:
    """Take the lock of run folder ``folder`` for this process (released when it exits).

    Raises `RunFolderBusyError` when a live run holds it. Warns when it takes over a stale one.
    """
    path = Path(folder) / LOCK_NAME
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)  # not inherited by exec'd children
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(fd)
            if not _dead_here(holder):
                os.close(fd)
                raise busy_refusal(folder, holder) from None
            log.warning("%s: %s; its lock is taken over", folder, _describe(holder, "ended"))
            with contextlib.suppress(FileNotFoundError):
                if _same_file(path, fd):
                    path.unlink()
            os.close(fd)
            continue
        if not _same_file(path, fd):  # replaced or removed by its holder between open and flock
            os.close(fd)
            continue
        holder = _read_holder(fd)
        if holder:
            log.warning(
                "%s: %s without releasing its lock; this run takes it over",
                folder,
                _describe(holder, "ended"),
            )
        _write_holder(fd)
        lock = RunFolderLock(path, fd)
        atexit.register(lock.release)
        return lock


def live_holder(folder: Path) -> dict | None:
    """The holder (pid, host, start time) of ``folder``'s lock while a live run holds it, else
    None. Changes nothing: no lock file is created, none taken over (a check made before a
    refusal that must leave the folder byte-identical)."""
    path = Path(folder) / LOCK_NAME
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # no lock file (or none this process may read): no run holds it
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(fd)
            return None if _dead_here(holder) else holder
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def busy_refusal(folder: Path, holder: dict) -> RunFolderBusyError:
    """The refusal of a run in ``folder``, held by the live run ``holder``."""
    return RunFolderBusyError(_busy_message(folder, holder), ("hydra.run.dir",))


def _same_file(path: Path, fd: int) -> bool:
    try:
        on_disk = path.stat()
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (on_disk.st_dev, on_disk.st_ino) == (held.st_dev, held.st_ino)


def _read_holder(fd: int) -> dict:
    os.lseek(fd, 0, os.SEEK_SET)
    text = os.read(fd, 4096).decode(errors="replace")
    try:
        holder = json.loads(text) if text.strip() else {}
    except json.JSONDecodeError:
        return {}
    return holder if isinstance(holder, dict) else {}


def _write_holder(fd: int) -> None:
    holder = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime()),
    }
    os.ftruncate(fd, 0)
    os.lseek(fd, 0, os.SEEK_SET)
    os.write(fd, (json.dumps(holder) + "\n").encode())


def _dead_here(holder: dict) -> bool:
    """The holder ran on this host and its process is gone (its pid names no process)."""
    if holder.get("host") != socket.gethostname() or not isinstance(holder.get("pid"), int):
        return False
    try:
        os.kill(holder["pid"], 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # another user's live process
        return False
    return False


def _describe(holder: dict, verb: str) -> str:
    who = f"pid {holder.get('pid', '?')} on host {holder.get('host', '?')}"
    return f"the run of {who} (started {holder.get('started', '?')}) {verb}"


def _busy_message(folder: Path, holder: dict) -> str:
    who = (
        f"pid {holder.get('pid', '?')} on host {holder.get('host', '?')}, started "
        f"{holder.get('started', '?')}"
        if holder
        else "a run that is starting now"
    )
    return (
        f"run folder {folder} is in use by another run ({who}); two runs in one folder overwrite "
        f"each other's checkpoints and records: wait for it to end, or start a new run elsewhere"
    )
