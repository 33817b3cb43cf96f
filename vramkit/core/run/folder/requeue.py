"""A requeued submitit job resumes from its run folder's ``last.ckpt``.

The one path a preempted or timed-out job takes under ``hydra/launcher=slurm`` (and its local
stand-in ``local_processes``):

1. submitit signals the job (SIGUSR2, ``signal_delay_s`` before the time limit, or at preemption
   where the cluster sends the user signal then);
2. :class:`~vramkit.core.callbacks.checkpoints.resume_checkpoint.ResumeCheckpoint` writes
``last.ckpt`` at the
   next step boundary and hands the signal to submitit's handler, which asks the launcher for the
   job to resubmit (hydra-submitit-launcher's ``checkpoint``: the same overrides) and requeues it;
   Lightning's own SLURM requeue (SIGUSR1) never fires, since submitit asks SLURM for SIGUSR2;
3. the requeued job composes the same config and gets the same run folder: Hydra resolved the
   sweep folder once in the submitting process and the launcher pickles it with its resolver
   cache, and a job's folder is ``<sweep folder>/<job number>``;
4. :func:`requeued_checkpoint` finds ``last.ckpt`` there and the job resumes from it, exactly.

A multirun claims a new sweep folder (``conf/hydra/default.yaml``), so a job that finds a
``last.ckpt`` in its own folder is an earlier attempt of itself: a submitit requeue, or SLURM's own
requeue of a preempted job (``PreemptMode=REQUEUE``), which resumes from the last periodic write.
A sweep pointed at an existing folder (``hydra.sweep.dir=<old sweep>``) continues its jobs so.
Under DDP the stop signals stay Lightning's and submitit's (the resume checkpoint takes them only
in a single-process run), so submitit requeues at once and the job resumes from the last periodic
write too.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path

from lightning.pytorch.callbacks import ModelCheckpoint
from omegaconf import DictConfig, OmegaConf

log = logging.getLogger(__name__)


def requeued_checkpoint(cfg: DictConfig, environ: Mapping[str, str]) -> Path | None:
    """The checkpoint a requeued submitit job resumes from: its run's ``last.ckpt``
    (``callbacks.last_checkpoint.dirpath`` / ``filename``) when that file exists.

    None for a run outside submitit (``SUBMITIT_EXECUTOR`` unset), a run given ``ckpt_path``, a run
    without the resume checkpoint, and a job's first attempt (no file yet).
    """
    if not environ.get("SUBMITIT_EXECUTOR") or cfg.get("ckpt_path"):
        return None
    node = OmegaConf.select(cfg, "callbacks.last_checkpoint")
    if node is None or node.get("dirpath") is None:
        return None
    path = (
        Path(str(node.dirpath)) / f"{node.get('filename', 'last')}{ModelCheckpoint.FILE_EXTENSION}"
    )
    return path if path.is_file() else None
