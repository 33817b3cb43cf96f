"""``last.ckpt``: the checkpoint a run resumes from, written whenever the run could be lost."""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.trainer.states import TrainerFn
from pydantic import Field

from vramkit.core.callbacks.checkpoints.pending_validation import (
    replay_validation,
    validation_pending,
)
from vramkit.core.callbacks.stop_signals import (
    STOP_SIGNALS,
    RunStopped,
    StopSignals,
    parse_signals,
    submitit_preempt_signal,
)
from vramkit.core.config.settings import Settings
from vramkit.core.io.checkpoint_io import atomic_link

log = logging.getLogger(__name__)


class ResumeCheckpointSettings(Settings):
    """The keys of ``callbacks.last_checkpoint`` (conf/callbacks/last_checkpoint.yaml)."""

    dirpath: str | None = None
    """The run's checkpoint folder."""
    filename: str = "last"
    """File name without ``.ckpt``."""
    every_n_train_steps: int | None = Field(50, ge=1)
    """Optimizer steps between writes inside an epoch; null: only at epoch ends and stops."""
    min_interval_s: float = Field(60.0, ge=0)
    """Seconds that must also have passed since the last write (or the start of training)
    for a step write: a fast loop trains instead of writing a checkpoint every fraction of a
    second; 0: every ``every_n_train_steps`` steps."""
    stop_signals: tuple[str, ...] = STOP_SIGNALS
    """Signals that stop the run at the next step boundary, with this checkpoint written."""


class ResumeCheckpoint(ModelCheckpoint):
    """Keeps ``<dirpath>/<filename>.ckpt`` a state a run continues from exactly.

    It is written

    - every ``every_n_train_steps`` optimizer steps, but no sooner than ``min_interval_s``
      seconds after the previous write (or the start of training), so a run killed mid-epoch
      (SIGKILL, a crash, a power cut) loses at most that many steps or about that much time,
      whichever is more. A write costs milliseconds of CPU time even for a tiny model (the
      checkpoint dictionary, pickling, two fsyncs): on a loop of 2 ms steps, every 50 steps
      alone cost 60-100 µs per step;
    - at the end of every epoch, after validation;
    - when the run stops early: at the step where ``trainer.should_stop`` is first set
      (``max_time``, early stopping), and that state is kept, so that the resumed run continues
      the cut epoch at its next batch instead of skipping the rest of it;
    - on a stop signal (``stop_signals``, by default SIGTERM, SIGINT and SIGUSR1): at the next
      training step boundary, or at the next batch boundary of the validation pass the signal
      interrupted; the run then ends with
      :class:`~vramkit.core.callbacks.stop_signals.RunStopped` (exit status 128 + the signal
      number), never as a success. Lightning's SLURM auto-requeue keeps SIGUSR1.
    - in a submitit job (``hydra/launcher=slurm``), also on submitit's preemption signal (SIGUSR2):
      at the next step boundary, and then submitit's own handler requeues the job; the requeued
      job finds this file in its run folder and resumes from it
      (:func:`vramkit.core.run.folder.requeue.requeued_checkpoint`).

    No validation is lost to a stop: a checkpoint written after a training batch that a
    validation pass follows (an epoch's last batch), or during that pass, records the batch as
    trained and the pass as not yet begun, so the resumed run validates before it trains on and
    ranks that epoch's metrics as the uninterrupted run did (:func:`validation_pending`).
    Lightning itself would resume such a checkpoint past the validation (its
    ``_TrainingEpochLoop.reset`` counts a save at ``on_train_batch_end`` of an epoch's last batch
    as a finished epoch) or into the epoch's end without the validation's metrics.

    A ``ModelCheckpoint`` without a monitor, so checkpoint retention and loggers know the file
    as the run's last checkpoint; training position, loader position (vramkit's loaders) and
    random generators (:class:`~vramkit.core.callbacks.checkpoints.random_state.RandomState`) travel
    in it.
    Signals are taken over only in a single-process run; under DDP Lightning's own SIGTERM
    handling stays.

    Its keys are the fields of `ResumeCheckpointSettings`, given as keyword arguments
    and kept validated in ``self.settings`` (see `vramkit.core.config.settings`).
    """

    settings_class = ResumeCheckpointSettings

    def __init__(self, **settings: Any) -> None:
        settings = ResumeCheckpointSettings.for_component(type(self), settings)
        try:
            signals = parse_signals(settings.stop_signals)
        except ValueError as error:
            raise ValueError(f"callbacks.last_checkpoint.stop_signals: {error}") from None
        super().__init__(
            dirpath=settings.dirpath,
            filename=settings.filename,
            monitor=None,
            save_top_k=1,
            enable_version_counter=False,
            save_on_train_epoch_end=True,
        )
        self.settings = settings
        self._written_at = -math.inf  # time.monotonic() of the last write or the start
        preempt = submitit_preempt_signal(os.environ)
        self.stop_signals = StopSignals(signals, hand_over=(preempt,) if preempt else ())
        self._stopped_in_epoch: int | None = None  # epoch whose stop state last.ckpt holds
        self._epoch_end_copies: list[Path] = []  # more names for this epoch end's checkpoint

    @property
    def state_key(self) -> str:
        """``ModelCheckpoint``'s key, built once: Lightning reads it at every hook call (for its
        profiler's action name), and ModelCheckpoint builds it from five settings each time,
        none of which changes after ``__init__``."""
        key = self.__dict__.get("_state_key")
        if key is None:
            key = self.__dict__["_state_key"] = super().state_key
        return key

    def writes_at_epoch_end(self, trainer: L.Trainer) -> bool:
        """Whether this callback writes a checkpoint at the end of the current training epoch
        (in a fit, not in the sanity check or a ``fast_dev_run``)."""
        return self._writes(trainer)

    def copy_at_epoch_end(self, path: str | os.PathLike[str]) -> None:
        """Have ``path`` hold the checkpoint of the current epoch's end as well, from the state
        this callback saves then (after every other callback's ``on_train_epoch_end``:
        Lightning runs checkpoint callbacks last). When that state goes to ``last.ckpt`` too,
        ``path`` is a hard link to it (`atomic_link`): the same state is not serialised and
        written twice, as ``ModelCheckpoint(save_last="link")`` links ``last.ckpt`` to the
        top-k file of the same step (lightning/pytorch/callbacks/model_checkpoint.py,
        ``_link_checkpoint``; a symbolic link there, which the target's deletion would break).
        Where no hard link can be made, or ``last.ckpt`` keeps an earlier stop's state, ``path``
        is written as a checkpoint of its own."""
        self._epoch_end_copies.append(Path(path))

    @property
    def path(self) -> Path:
        """The checkpoint file."""
        return Path(str(self.dirpath)) / f"{self.filename}{self.FILE_EXTENSION}"

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._written_at = time.monotonic()
        # After Lightning installed its own SIGTERM handler (Trainer._run), which this replaces.
        if trainer.world_size == 1 and not trainer.fast_dev_run:
            self.stop_signals.install()

    def on_train_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        # Runs every step, so the cheapest checks come first. Training batches run only in a
        # fit and never in the sanity check, so of `_writes` only fast_dev_run can say no here
        # (its enum comparisons cost more than the rest of this hook).
        if trainer.fast_dev_run:
            return
        if self.stop_signals.received is not None:
            self._stop_on_signal(trainer)
        if trainer.should_stop:
            if self._stopped_in_epoch != trainer.current_epoch:
                self._write(trainer, "the run stops early")
                self._stopped_in_epoch = trainer.current_epoch
            return
        # Only where a batch ended an optimizer step: accumulated gradients are no part of a
        # checkpoint, so one written between the batches of a step would resume it short.
        if (
            self.settings.every_n_train_steps
            and time.monotonic() - self._written_at >= self.settings.min_interval_s
            and trainer.global_step % self.settings.every_n_train_steps == 0
            and (batch_idx + 1) % trainer.accumulate_grad_batches == 0
        ):
            self._write(trainer, f"every {self.settings.every_n_train_steps} steps")

    # A signal during validation stops at the pass's next batch boundary: the checkpoint then
    # replays the whole pass (on_save_checkpoint). One that comes after the pass's last batch
    # stops at the epoch's end (or the next training step), once the metrics are ranked.
    def on_validation_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        if self.stop_signals.received is not None and self._writes(trainer):
            self._stop_on_signal(trainer)

    def on_save_checkpoint(
        self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        # Every checkpoint of the fit passes here, whichever callback writes it.
        if self._writes(trainer) and validation_pending(trainer):
            replay_validation(checkpoint)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        copies, self._epoch_end_copies = self._epoch_end_copies, []
        if not self._writes(trainer):
            return
        if self.stop_signals.received is not None:
            self._stop_on_signal(trainer, copies)
        if trainer.should_stop and self._stopped_in_epoch == trainer.current_epoch:
            # last.ckpt keeps the state of the step the run stopped at; the copies get this one
            for path in copies:
                trainer.save_checkpoint(path, weights_only=False)
            return
        self._write(trainer, "end of epoch", copies)

    # The handlers go back before Lightning's teardown restores the ones from before the fit
    # (Trainer._teardown runs after on_train_end and on_exception, before the teardown hooks).
    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.stop_signals.uninstall()

    def on_exception(
        self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException
    ) -> None:
        self.stop_signals.uninstall()

    def _writes(self, trainer: L.Trainer) -> bool:
        return (
            trainer.state.fn == TrainerFn.FITTING
            and not trainer.sanity_checking
            and not trainer.fast_dev_run
        )

    def _write(self, trainer: L.Trainer, reason: str, copies: Sequence[Path] = ()) -> None:
        # resumable; left unset, Lightning logs a line saying it chose that
        trainer.save_checkpoint(self.path, weights_only=False)
        self._written_at = time.monotonic()
        self.last_model_path = self.best_model_path = str(self.path)
        log.debug("wrote %s at step %d (%s)", self.path, trainer.global_step, reason)
        for path in copies:
            self._copy(trainer, path)

    def _copy(self, trainer: L.Trainer, path: Path) -> None:
        """``path`` as a hard link to the ``last.ckpt`` just written, else written itself."""
        linked = False
        if trainer.is_global_zero:  # the one process that writes files
            try:
                atomic_link(self.path, path)
                linked = True
            except OSError as error:
                log.debug("%s written on its own, not linked to %s: %s", path, self.path, error)
        # a write is collective (trainer.save_checkpoint waits at a barrier): every process
        # takes the way rank 0 took
        if not trainer.strategy.broadcast(linked):
            trainer.save_checkpoint(path, weights_only=False)

    def _stop_on_signal(self, trainer: L.Trainer, copies: Sequence[Path] = ()) -> None:
        received = self.stop_signals.received
        assert received is not None
        pending = validation_pending(trainer)
        self._write(trainer, received.name, copies)
        stopped = (
            f"{received.name}: stopped at step {trainer.global_step} (epoch "
            f"{trainer.current_epoch}"
            + (", before its validation, which the resumed run does first" if pending else "")
            + f") and saved {self.path}"
        )
        if received in self.stop_signals.hand_over_signals:
            log.warning("%s; submitit requeues the job, which resumes from it", stopped)
            self.stop_signals.hand_over()  # ends the process when submitit requeues
        message = f"{stopped}; continue the run with the same overrides and ckpt_path={self.path}"
        log.warning(message)
        raise RunStopped(received, message)
