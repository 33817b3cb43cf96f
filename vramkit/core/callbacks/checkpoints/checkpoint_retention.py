"""Periodic checkpoints with a count limit and a disk budget, and a storage report per run.

Lightning's ``ModelCheckpoint`` keeps the top-k checkpoints by the monitored metric and
``last.ckpt``. `CheckpointRetention` adds what it lacks:

- a periodic checkpoint ``periodic_epoch_<epoch>.ckpt`` every ``every_n_epochs`` epochs, of
  which only the newest ``keep_last`` are kept. Where vramkit's ``last.ckpt``
  (`ResumeCheckpoint`) is written at the same epoch end, from the same state, the periodic file
  is a hard link to it (one file on disk, one serialisation; the folder's size counts it once);
  elsewhere it is written on its own;
- a disk budget for the run's checkpoint folder: when the folder grows past ``budget_gib``, the
  oldest periodic checkpoints go first, then ``ModelCheckpoint``'s runner-up top-k files;
- never deleted: each ``ModelCheckpoint``'s best and last checkpoint, and the checkpoint the
  run resumed from (``trainer.ckpt_path``);
- at fit start, leftovers of writes killed midway (see `vramkit.core.io.checkpoint_io`) are removed;
- at the end of the run, a storage report: every file with its size and role, and what was
  pruned and why (logged, and written as JSON to ``report_path``).

Saving goes through ``trainer.save_checkpoint``; with
`vramkit.core.io.checkpoint_io.AtomicCheckpointIO` as the Trainer's checkpoint plugin every write
is atomic, which `setup` checks.
"""

from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint
from pydantic import Field

from vramkit.core.callbacks.checkpoints.resume_checkpoint import ResumeCheckpoint
from vramkit.core.config.settings import ConfigPath, Settings
from vramkit.core.io.checkpoint_io import AtomicCheckpointIO, atomic_write_bytes, is_partial_write
from vramkit.core.io.disk_space import free_bytes
from vramkit.core.tables import render_table
from vramkit.core.units import GIB, MIB

log = logging.getLogger(__name__)

PERIODIC_PREFIX = "periodic_epoch_"
"""File-name prefix of the periodic checkpoints: ``periodic_epoch_007.ckpt`` (0-based epoch)."""

_PERIODIC_NAME = re.compile(rf"^{PERIODIC_PREFIX}(\d+)\.ckpt$")


class CheckpointRetentionSettings(Settings):
    """The keys of ``callbacks.checkpoint_retention`` (conf/callbacks/checkpoint_retention.yaml)."""

    every_n_epochs: int = Field(2, ge=1)
    """Save ``periodic_epoch_<epoch>.ckpt`` after every n-th training epoch."""
    keep_last: int = Field(3, ge=1)
    """Periodic checkpoints kept: the newest by write time, so a run resumed from an earlier
    epoch keeps its own new files, not the abandoned future ones."""
    budget_gib: float | None = Field(5.0, ge=0)
    """Size limit of the checkpoint folder (GiB); null for none."""
    dirpath: ConfigPath | None = None
    """The folder it manages; null: the first ModelCheckpoint's dirpath, else
    ``<default_root_dir>/checkpoints``."""
    report_path: ConfigPath | None = None
    """Where the JSON storage report is written at the end of the run; null: only logged."""


@dataclass(frozen=True)
class PrunedFile:
    """A file the policy deleted: its name, size in bytes, and the rule that deleted it."""

    name: str
    size_bytes: int
    reason: str


class CheckpointRetention(L.Callback):
    """Saves a checkpoint every ``every_n_epochs`` epochs and keeps the checkpoint folder bounded.

    Its keys are the fields of `CheckpointRetentionSettings`, given as keyword arguments and
    kept validated in ``self.settings`` (see `vramkit.core.config.settings`).
    """

    settings_class = CheckpointRetentionSettings

    def __init__(self, **settings: Any) -> None:
        self.settings = CheckpointRetentionSettings.for_component(type(self), settings)
        self.pruned: list[PrunedFile] = []
        self.removed_partial_writes: list[str] = []
        self._folder: Path | None = None
        self._over_budget_warned = False
        self._reported = False
        self._trainer: L.Trainer | None = None

    @property
    def folder(self) -> Path:
        """The checkpoint folder this policy manages (known from ``on_fit_start`` on)."""
        if self._folder is None:
            raise RuntimeError("CheckpointRetention.folder is known only once fitting started")
        return self._folder

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        self._trainer = trainer
        if isinstance(trainer.strategy.checkpoint_io, AtomicCheckpointIO):
            trainer.strategy.checkpoint_io.make_room = self.make_room
        else:
            log.warning(
                "checkpoint writes are not atomic: the Trainer uses %s; pass "
                "plugins=[vramkit.core.io.checkpoint_io.AtomicCheckpointIO()] "
                "(conf/trainer/default.yaml) "
                "so that a killed run cannot leave a truncated checkpoint",
                type(trainer.strategy.checkpoint_io).__name__,
            )

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # ModelCheckpoint resolves its dirpath in its own setup, which runs after this one's.
        self._folder = self._resolve_folder(trainer)
        self.pruned = []
        self.removed_partial_writes = []
        self._reported = False
        self._over_budget_warned = False
        if trainer.is_global_zero:
            self._remove_partial_writes()

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # ModelCheckpoint runs after this callback in every hook, so its writes at the end of the
        # previous epoch are only visible now.
        self._prune(trainer)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.fast_dev_run:  # a wiring check writes no checkpoints, like ModelCheckpoint
            return
        if (trainer.current_epoch + 1) % self.settings.every_n_epochs != 0:
            return
        path = self.folder / f"{PERIODIC_PREFIX}{trainer.current_epoch:03d}.ckpt"
        writer = _epoch_end_writer(trainer)
        if writer is not None:
            # last.ckpt is written after this hook from the epoch's final state: the periodic
            # checkpoint becomes a second name of that file, not a second serialisation of the
            # same state (pruned at the next epoch's start, or at the end of the fit)
            writer.copy_at_epoch_end(path)
            return
        # a full checkpoint; left unset, Lightning logs a line saying it chose that
        trainer.save_checkpoint(path, weights_only=False)
        self._prune(trainer)

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._prune(trainer)
        self._report(trainer)

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        # A run that stopped on an exception still says what its folder holds.
        if stage == "fit" and self._folder is not None and not self._reported:
            self._report(trainer)

    def _resolve_folder(self, trainer: L.Trainer) -> Path:
        if self.settings.dirpath is not None:
            return self.settings.dirpath
        for callback in _model_checkpoints(trainer):
            if callback.dirpath is not None:
                return Path(callback.dirpath)
        return Path(trainer.default_root_dir) / "checkpoints"

    def _remove_partial_writes(self) -> None:
        if not self.folder.is_dir():
            return
        for path in sorted(self.folder.iterdir()):
            if is_partial_write(path) and not _writer_alive(path):
                path.unlink(missing_ok=True)
                self.removed_partial_writes.append(path.name)
                log.warning("removed %s, left by a checkpoint write that was killed", path)

    def _prune(self, trainer: L.Trainer) -> None:
        if trainer.is_global_zero and self.folder.is_dir():
            self._prune_by_count(trainer)
            self._prune_by_budget(trainer)
        trainer.strategy.barrier("checkpoint_retention_prune")

    def _prune_by_count(self, trainer: L.Trainer) -> None:
        roles = _roles(trainer, self.folder)
        periodic = [p for p in _oldest_first(self.folder) if roles.get(p.name) == "periodic"]
        reason = f"older than the newest {self.settings.keep_last} periodic checkpoints"
        for path in periodic[: max(0, len(periodic) - self.settings.keep_last)]:
            self._delete(path, reason)

    def _prune_by_budget(self, trainer: L.Trainer) -> None:
        if self.settings.budget_gib is None:
            return
        budget_bytes = self.settings.budget_gib * GIB
        total = _folder_bytes(self.folder)
        if total <= budget_bytes:
            return
        roles = _roles(trainer, self.folder)
        by_age = _oldest_first(self.folder)
        candidates = [p for p in by_age if roles.get(p.name) == "periodic"]
        candidates += [p for p in by_age if roles.get(p.name) in ("top-k", "other")]
        reason = f"checkpoint folder over its {self.settings.budget_gib:g} GiB budget"
        for path in candidates:
            if total <= budget_bytes:
                break
            total -= self._delete(path, reason)
        if total > budget_bytes and not self._over_budget_warned:
            self._over_budget_warned = True
            log.warning(
                "checkpoint folder %s holds %.3f GiB, over its %g GiB budget, and every file "
                "left is protected (best, last or resumed-from): raise budget_gib",
                self.folder,
                total / GIB,
                self.settings.budget_gib,
            )

    def make_room(self, folder: Path, needed_bytes: int) -> None:
        """Before a checkpoint write of ``needed_bytes`` into ``folder``: when that is the managed
        folder and its disk has less free, prune (periodic checkpoints first, then runner-up
        top-k; oldest first) until it has. A write that still does not fit is refused by the
        checkpoint IO. (The budget is kept after each write, as the folder's size then is known.)"""
        trainer = self._trainer
        if trainer is None or self._folder is None or not trainer.is_global_zero:
            return
        if not folder.is_dir() or folder.resolve() != self._folder.resolve():
            return
        roles = _roles(trainer, folder)
        by_age = _oldest_first(folder)
        candidates = [p for p in by_age if roles.get(p.name) == "periodic"]
        candidates += [p for p in by_age if roles.get(p.name) in ("top-k", "other")]
        reason = f"room on the disk for the next checkpoint ({needed_bytes / MIB:.0f} MiB)"
        for path in candidates:
            if free_bytes(folder) >= needed_bytes:
                return
            self._delete(path, reason)

    def _delete(self, path: Path, reason: str) -> int:
        """Delete ``path``; the bytes that frees (none for a file with another name left)."""
        status = path.lstat()
        path.unlink(missing_ok=True)
        self.pruned.append(PrunedFile(name=path.name, size_bytes=status.st_size, reason=reason))
        log.info("pruned %s (%.1f MiB): %s", path.name, status.st_size / MIB, reason)
        return status.st_size if status.st_nlink == 1 else 0

    def storage_report(self, trainer: L.Trainer) -> dict[str, Any]:
        """What the checkpoint folder holds now (name, size, role) and what was pruned and why."""
        roles = _roles(trainer, self.folder)
        files = []
        if self.folder.is_dir():
            for path in sorted(self.folder.iterdir()):
                if path.is_file() or path.is_symlink():
                    role = roles.get(path.name, "other")
                    files.append({"name": path.name, "bytes": path.lstat().st_size, "role": role})
        total = _folder_bytes(self.folder) if self.folder.is_dir() else 0
        budget_gib = self.settings.budget_gib
        return {
            "folder": str(self.folder),
            "total_bytes": total,
            "budget_gib": budget_gib,
            "over_budget": budget_gib is not None and total > budget_gib * GIB,
            "every_n_epochs": self.settings.every_n_epochs,
            "keep_last": self.settings.keep_last,
            "files": files,
            "pruned": [asdict(entry) for entry in self.pruned],
            "removed_partial_writes": list(self.removed_partial_writes),
        }

    def _report(self, trainer: L.Trainer) -> None:
        self._reported = True
        if not trainer.is_global_zero:
            return
        report = self.storage_report(trainer)
        # The folder on the header line, never inside the table: a table's title wraps at its
        # width and would split the path mid-word, and a path is there to be copied.
        log.info("Checkpoint storage in %s\n%s", report["folder"], _render(report))
        if self.settings.report_path is not None:
            atomic_write_bytes(self.settings.report_path, json.dumps(report, indent=2).encode())


def _model_checkpoints(trainer: L.Trainer) -> list[ModelCheckpoint]:
    return [c for c in trainer.checkpoint_callbacks if isinstance(c, ModelCheckpoint)]


def _roles(trainer: L.Trainer, folder: Path) -> dict[str, str]:
    """Role of each checkpoint file in ``folder``: best, last, resumed-from, periodic, top-k, other.

    The protected roles (best, last, resumed-from) win over the others; a symbolic link's target
    shares the link's protection (``save_last="link"``).
    """
    protected: dict[Path, str] = {}

    def protect(path: str | os.PathLike[str] | None, role: str) -> None:
        if path:
            protected.setdefault(Path(path).absolute(), role)
            protected.setdefault(Path(path).resolve(), role)

    top_k: set[Path] = set()
    for callback in _model_checkpoints(trainer):
        # Without a monitor a ModelCheckpoint's "best" is its newest file. Such a callback
        # with filename "last" is how a run keeps a last.ckpt of every epoch under Lightning
        # 2.6, whose save_last writes only when a top-k checkpoint is written at the same step.
        protect(callback.best_model_path, "best" if callback.monitor else "last")
        protect(callback.last_model_path, "last")
        top_k.update(Path(p).resolve() for p in callback.best_k_models)
    protect(trainer.ckpt_path, "resumed-from")

    roles = {}
    for path in folder.iterdir() if folder.is_dir() else ():
        if is_partial_write(path) or not (path.is_file() or path.is_symlink()):
            continue
        absolute, real = path.absolute(), path.resolve()
        if absolute in protected or real in protected:
            roles[path.name] = protected.get(absolute) or protected[real]
        elif _PERIODIC_NAME.match(path.name):
            roles[path.name] = "periodic"
        elif real in top_k:
            roles[path.name] = "top-k"
        elif path.suffix == ".ckpt":
            roles[path.name] = "other"
    return roles


def _oldest_first(folder: Path) -> list[Path]:
    paths = [p for p in folder.iterdir() if p.is_file() or p.is_symlink()]
    return sorted(paths, key=lambda p: (p.lstat().st_mtime_ns, p.name))


def _folder_bytes(folder: Path) -> int:
    """Bytes the files in ``folder`` take, each file once however many names (hard links) it has
    there (a periodic checkpoint linked to last.ckpt)."""
    sizes = {}
    for path in folder.rglob("*"):
        if path.is_file() or path.is_symlink():
            status = path.lstat()
            sizes[status.st_dev, status.st_ino] = status.st_size
    return sum(sizes.values())


def _epoch_end_writer(trainer: L.Trainer) -> ResumeCheckpoint | None:
    """The registered `ResumeCheckpoint` that writes last.ckpt at this epoch's end, if any."""
    for callback in trainer.checkpoint_callbacks:
        if isinstance(callback, ResumeCheckpoint) and callback.writes_at_epoch_end(trainer):
            return callback
    return None


def _writer_alive(path: Path) -> bool:
    """Whether the process whose pid is in a partial write's name still runs (it may be writing)."""
    pid = int(path.name.rsplit(".tmp-", 1)[1].split("-")[0])
    if pid == os.getpid():
        return True
    if os.name == "nt":
        return True  # os.kill(pid, 0) would terminate the process on Windows: keep the file
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # alive, owned by another user
    return True


def _render(report: dict[str, Any]) -> str:
    rows = [[e["name"], f"{e['bytes'] / MIB:.1f}", e["role"]] for e in report["files"]]
    rows += [
        [e["name"], f"{e['size_bytes'] / MIB:.1f}", f"pruned: {e['reason']}"]
        for e in report["pruned"]
    ]
    rows += [
        [n, "", "removed: partial write of a killed run"] for n in report["removed_partial_writes"]
    ]
    budget = "no budget" if report["budget_gib"] is None else f"budget {report['budget_gib']:g} GiB"
    return render_table(
        ["file", "MiB", "role / why pruned"],
        rows,
        caption=f"total {report['total_bytes'] / GIB:.3f} GiB, {budget}",
        left=["role / why pruned"],
    )
