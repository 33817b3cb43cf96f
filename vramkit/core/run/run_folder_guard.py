"""A Hydra callback that claims a run's folder (a sweep's: its sweep folder) before Hydra writes
into it.

``on_run_start`` runs after composition and before Hydra's ``run_job`` (``hydra/core/utils.py``)
reads ``hydra.run.dir``, makes the folder (``mkdir(parents=True, exist_ok=True)``), writes
``.hydra/`` and opens the log. Here the folder is read (the ``run_folder`` resolver names it and
creates nothing) and made: this is the one place a run's folder is made, after the checks that need
no folder (`vramkit.core.run.resume_contract.ResumeContract` runs before; a user's mistake refused
later, in ``train``, removes the folder again). A folder the user gave, or the resumed run's, is
checked first, changing nothing: a run is refused in a folder another run owns
(`check_folder_owner`: its checkpoints or records, unless this run resumes them; a running sweep's
job folder). A folder the resolver named new is created atomically (`create_run_folder`); when a
run started in the same second took the name in between, this run's folder is the next free name,
written into ``hydra.run.dir`` before Hydra reads it (a sweep's into ``hydra.sweep.dir`` and
Hydra's override list, from which Hydra composes every job's config: ``load_sweep_config`` in
``hydra/_internal/config_loader_impl.py``). The folder is then locked and its contents noted
(:mod:`vramkit.core.run.folder.run_folder_claim`): a second run in a held folder is refused in one
line before it writes anything, and a refusal of this run removes what it wrote. A folder that
cannot be created (a read-only ``paths.log_dir``) is refused the same way. A sweep holds its sweep
folder from ``on_multirun_start`` (after `SweepPrecheck`, so a refused sweep creates none) to its
end, and each job its job folder (`claim_job_folder`, the first thing ``train`` does: Hydra writes
a job's records before any callback sees the job, and a refusal raised by a callback would end the
whole sweep, where one raised in the job fails that job alone) until ``on_job_end``.

Only the launching process claims: the processes Lightning starts for DDP (``trainer=ddp_sim``)
run ``train.py`` again in the same folder with ``LOCAL_RANK`` >= 1, and the processes of a
cluster launch (torchrun, SLURM tasks) carry their rank too.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.core.utils import JobReturn
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from vramkit.core.run.folder.run_folder import create_run_folder
from vramkit.core.run.folder.run_folder_claim import claim_run_folder, release_claim
from vramkit.core.run.folder.run_folder_owner import check_folder_owner, resumes_its_run
from vramkit.core.run.refusal.exit_codes import (
    REFUSALS,
    refusals_as_messages,
    refusals_before_the_sweep,
)

RANK_VARIABLES = ("RANK", "LOCAL_RANK", "SLURM_PROCID", "JSM_NAMESPACE_RANK")
"""Where launchers put a process's rank (as Lightning reads it for ``rank_zero_only``)."""


class RunFolderGuard(Callback):
    """Hydra callback: lock a single run's folder, or a sweep's, before Hydra writes into it."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        if not launching_process(os.environ):
            return
        with refusals_as_messages():
            folder = Path(resolved_folder(config, "hydra.run.dir"))
            # Only a training run resumes: eval's ckpt_path is what it reads, not its folder.
            trains = "train" in config
            resumed = config.get("ckpt_path") if trains else None
            if named_new(config, "hydra.run.dir", resumed):  # no other run's: made for this one
                folder = _created(config, "hydra.run.dir", folder)
            else:
                check_folder_owner(folder, resumed, os.environ, trains=trains)
            claim_run_folder(folder)

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        # The sweep's jobs live in numbered subfolders of the sweep folder it holds.
        if not launching_process(os.environ):
            return
        with refusals_before_the_sweep():
            folder = Path(resolved_folder(config, "hydra.sweep.dir"))
            if named_new(config, "hydra.sweep.dir", None):
                folder = _created(config, "hydra.sweep.dir", folder)
            claim_run_folder(folder)

    def on_run_end(self, config: DictConfig, **kwargs: Any) -> None:
        release_claim()

    def on_job_end(self, config: DictConfig, job_return: JobReturn, **kwargs: Any) -> None:
        if HydraConfig.get().mode == RunMode.MULTIRUN:
            release_claim(Path(config.hydra.runtime.output_dir))

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        release_claim()


def claim_job_folder(environ: dict[str, str] | os._Environ) -> None:
    """In a sweep's job, lock the job's folder for this process as a single run's is locked
    (released by `RunFolderGuard.on_job_end`); `RunFolderBusyError` when a live run holds it.
    Nothing to do outside a multirun, or in a process that does not claim."""
    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        return
    if launching_process(environ):
        claim_run_folder(Path(HydraConfig.get().runtime.output_dir))


def launching_process(environ: dict[str, str] | os._Environ) -> bool:
    """This process is rank 0 (or no launcher gave it a rank): the one that claims the folder."""
    return all(int(environ.get(name, "0") or 0) == 0 for name in RANK_VARIABLES)


def named_new(config: DictConfig, key: str, ckpt_path: str | None) -> bool:
    """``key`` of ``config`` is a folder the ``run_folder`` resolver named for a new run: not a
    folder the user gave, not the resumed run's (``ckpt_path``'s), not a requeued SLURM job's."""
    parent, _, leaf = key.rpartition(".")
    raw = OmegaConf.to_container(OmegaConf.select(config, parent), resolve=False).get(leaf)
    if not (isinstance(raw, str) and raw.startswith("${run_folder:")):
        return False
    folder = Path(resolved_folder(config, key)).absolute()
    return not resumes_its_run(folder, ckpt_path, os.environ)


def _created(config: DictConfig, key: str, named: Path) -> Path:
    # The folder created for the run; a name taken since it was read is replaced where Hydra
    # reads it, and, for a sweep's folder, in the overrides Hydra composes each job from.
    folder = create_run_folder(named)
    if folder != named.absolute():
        with read_write(config), open_dict(config):
            OmegaConf.update(config, key, str(folder))
            if key == "hydra.sweep.dir":
                # quoted: a comma or a space in the path would read as a sweep
                config.hydra.overrides.hydra.append(f"{key}='{folder}'")
    return folder


def resolved_folder(config: DictConfig, key: str) -> str:
    """``key`` (``hydra.run.dir``, ``hydra.sweep.dir``) of ``config``, resolved (named); a
    refusal met while resolving it (an unwritable ``paths.log_dir``) is raised as itself, not as
    OmegaConf's wrapper."""
    try:
        return str(OmegaConf.select(config, key))
    except Exception as error:
        cause = error.__cause__ or error.__context__
        while cause is not None and not isinstance(cause, REFUSALS):
            cause = cause.__cause__ or cause.__context__
        if cause is None:
            raise
        raise cause from None
