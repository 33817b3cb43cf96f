"""This process's claim on its run folder: the lock, and what the folder held before the run.

A mistake refused before any work must leave no run folder, but Hydra creates the folder, writes
``.hydra/`` and opens the log before ``train(cfg)`` can check anything. So the claim remembers what
the folder held when this run took it, and `withdraw_claim` (called on a refusal) removes what the
run added: the whole folder when this run created it, only the run's own records and log lines in
a resumed run's folder. It removes nothing once the run has done work (anything beyond records:
checkpoints, logger output), since then the refusal came late and what was written is evidence.
"""

from __future__ import annotations

import contextlib
import fnmatch
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from vramkit.core.config.schema import ConfigError
from vramkit.core.run.folder.run_folder import CREATED
from vramkit.core.run.folder.run_folder_lock import RunFolderLock, lock_run_folder

log = logging.getLogger(__name__)

RECORDS = (
    ".hydra",
    ".hydra.resume_*",
    "*.log",
    ".lock",
    "resolved_config*.yaml",
    "overrides*.txt",
    "run_environment*.json",
    "fit_decision*.json",
    "memory_plan*.json",
)
"""Names of what a run writes into its folder before any work: Hydra's records and log, the lock,
and train()'s records of its config, environment and plan (resumed runs add ``resume_<n>``)."""


@dataclass
class RunFolderClaim:
    """A run folder this process holds: its lock, and what the folder held when it was taken."""

    folder: Path
    lock: RunFolderLock
    top_created: Path | None  # the topmost folder this run created for it (None: it existed)
    entries: frozenset[str]  # names in the folder before this run wrote anything
    log_sizes: dict[str, int]  # bytes of each existing log, which this run appends to

    def withdraw(self) -> bool:
        """Undo this run's writes to the folder if it did no work yet; True when it did so."""
        added = set(os.listdir(self.folder)) - self.entries
        if not all(any(fnmatch.fnmatch(name, p) for p in RECORDS) for name in added):
            return False
        _close_logs_in(self.folder)
        for name in sorted(added - {self.lock.path.name}):
            path = self.folder / name
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()
        for name, size in self.log_sizes.items():  # a resumed run's log, without this run's lines
            with contextlib.suppress(FileNotFoundError):
                os.truncate(self.folder / name, size)
        self.lock.release()
        if self.top_created is not None:
            for folder in (self.folder, *self.folder.parents):
                with contextlib.suppress(OSError):  # not empty: another run's folder is there
                    folder.rmdir()
                if folder == self.top_created:
                    break
        return True


_claims: list[RunFolderClaim] = []
"""The folders this process holds, oldest first: a single run's, or a sweep's and its current
job's (jobs of the basic launcher run one after another in the sweep's process)."""


def claim_run_folder(folder: Path) -> RunFolderClaim:
    """Lock ``folder`` (creating it if needed) for this process and remember what it holds.

    Raises `RunFolderBusyError` when another live run holds it.
    """
    folder = Path(folder).absolute()
    top_created = CREATED.get(folder)
    if top_created is None and not folder.exists():
        missing = [p for p in (folder, *folder.parents) if not p.exists()]
        top_created = missing[-1]
    try:
        folder.mkdir(parents=True, exist_ok=True)
        entries = frozenset(os.listdir(folder))
        lock = lock_run_folder(folder)
    except OSError as error:  # read-only, or a file in its path: the user's to change
        raise ConfigError(
            f"hydra.run.dir: cannot write into the run folder {folder} ({error.strerror}); "
            f"run where you can write (paths.log_dir=<a folder you can write to>)",
            ("hydra.run.dir",),
        ) from None
    logs = {name: (folder / name).stat().st_size for name in entries if name.endswith(".log")}
    claim = RunFolderClaim(folder, lock, top_created, entries, logs)
    _claims.append(claim)
    return claim


def withdraw_claim() -> bool:
    """On a refusal: undo what this run wrote into its folder (the newest claim), if it did no
    work yet (see `RunFolderClaim.withdraw`); False when there is no claim or it must stay."""
    if not _claims:
        return False
    claim = _claims.pop()
    try:
        return claim.withdraw()
    except OSError as error:  # the refusal's message matters more than this cleanup
        log.warning("could not remove what this run wrote into %s: %s", claim.folder, error)
        return False


def release_claim(folder: Path | None = None) -> None:
    """The run, job or sweep ended: let its folder go (the lock file goes with it); every
    folder this process holds when ``folder`` is None."""
    for claim in list(_claims):
        if folder is None or claim.folder == Path(folder).absolute():
            claim.lock.release()
            _claims.remove(claim)


def _close_logs_in(folder: Path) -> None:
    # The job's file handler (train.log) is open; a removed log must not be written again.
    root = logging.getLogger()
    for handler in list(root.handlers):
        name = getattr(handler, "baseFilename", None)
        if name is not None and Path(name).is_relative_to(folder):
            root.removeHandler(handler)
            handler.close()
