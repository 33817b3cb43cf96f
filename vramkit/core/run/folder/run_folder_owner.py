"""A run owns its folder: a new run is refused in a folder that holds another run's checkpoints
or records, and in the job folder of a running sweep.

``hydra.run.dir=<a finished or killed run's folder>`` without ``ckpt_path`` used to start a new
run there: it overwrote the other run's ``last.ckpt`` and named its own records ``resume_1``
though it resumed nothing. `check_folder_owner` runs before the folder is locked or written
(`vramkit.core.run.run_folder_guard`) and changes nothing in it, so a refused run leaves the other
run's folder byte-identical. A run may write into a folder that holds records only when it
resumes that folder's run: its ``ckpt_path`` lies in the folder, or it is a requeued SLURM job
getting its own ``slurm-<job id>`` folder back (Lightning restores its ``hpc_ckpt_<n>.ckpt``).
Every other run writes into a folder of its own, so the ``resume_<n>`` records
(`vramkit.core.run.folder.run_folder.record_name`) are a resume's alone.

A sweep's jobs live in numbered subfolders of the sweep folder, which the sweep holds locked
until it ends; a single run pointed at one of them (started, finished or not yet begun) is
refused while the sweep runs, so the sweep's summary reports only its own jobs' checkpoints.
"""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Mapping
from pathlib import Path

from vramkit.core.config.schema import ConfigError
from vramkit.core.run.folder.run_folder import CHECKPOINTS, slurm_name
from vramkit.core.run.folder.run_folder_lock import busy_refusal, live_holder

RUN_RECORDS = (
    ".hydra",
    ".hydra.resume_*",
    "*.log",
    "resolved_config*.yaml",
    "overrides*.txt",
    "run_environment*.json",
    "fit_decision*.json",
    "memory_plan*.json",
    "job_result.json",
    "*.ckpt",
)
"""Names whose presence shows a run has used a folder (beside a ``checkpoints/`` with a
``.ckpt`` in it). A stale ``.lock`` alone is no run's record: its run wrote nothing else."""

_NAMED = 2
"""How many of a folder's checkpoints a refusal names before it counts the rest."""


def check_folder_owner(
    folder: Path,
    ckpt_path: str | None,
    environ: Mapping[str, str] | os._Environ,
    *,
    trains: bool = True,
) -> None:
    """Raise `ConfigError` (a `RunFolderBusyError` for a live holder) when the run about to use
    ``folder`` would write where another run's checkpoints or records are, or where a live run
    or running sweep holds it. ``ckpt_path``: the checkpoint this run resumes, if any;
    ``trains``: False for a tool (eval, export), which resumes nothing and so is not told to."""
    folder = Path(folder).absolute()
    holder = live_holder(folder)
    if holder is not None:
        raise busy_refusal(folder, holder)
    sweep = live_holder(folder.parent)
    if sweep is not None:
        raise ConfigError(
            f"hydra.run.dir: {folder} is a job folder of the sweep running in {folder.parent} "
            f"(pid {sweep.get('pid', '?')} on host {sweep.get('host', '?')}); its jobs own their "
            "folders: choose another folder",
            ("hydra.run.dir",),
        )
    if trains and resumes_its_run(folder, ckpt_path, environ):
        return
    records = run_records(folder)
    if not records:
        return
    checkpoints = checkpoints_in(folder)
    if checkpoints and trains:
        held = f"holds run {folder.name}'s checkpoints ({_named(checkpoints)})"
        advice = f"resume it with ckpt_path={_resume_point(checkpoints)}, or choose another folder"
    else:
        kind = "checkpoints and records" if checkpoints else "records and no checkpoint"
        held = f"holds run {folder.name}'s {kind} ({_named(records)})"
        advice = "choose another folder"
    raise ConfigError(
        f"hydra.run.dir: {folder} {held}; a new run there would overwrite them: {advice} "
        "(leave hydra.run.dir unset for a folder of its own)",
        ("hydra.run.dir",),
    )


def run_records(folder: Path) -> list[str]:
    """The names in ``folder`` that show a run has used it (`RUN_RECORDS`, a ``checkpoints/``
    holding a checkpoint), sorted; [] for a missing or unused folder."""
    try:
        names = os.listdir(folder)
    except (FileNotFoundError, NotADirectoryError):
        return []
    found = [name for name in names if any(fnmatch.fnmatch(name, p) for p in RUN_RECORDS)]
    if checkpoints_in(folder):
        found.append(CHECKPOINTS)
    return sorted(set(found))


def checkpoints_in(folder: Path) -> list[Path]:
    """The checkpoints a run wrote in ``folder`` (``checkpoints/*.ckpt``, and Lightning's SLURM
    ``hpc_ckpt_<n>.ckpt`` beside them), newest first."""
    found = [*folder.glob(f"{CHECKPOINTS}/*.ckpt"), *folder.glob("*.ckpt")]
    return sorted(
        (path for path in found if path.is_file()), key=lambda p: p.stat().st_mtime, reverse=True
    )


def resumes_its_run(
    folder: Path, ckpt_path: str | None, environ: Mapping[str, str] | os._Environ
) -> bool:
    """``folder`` is the run folder this run resumes: ``ckpt_path`` lies in it, or it is a
    requeued SLURM job's own."""
    if ckpt_path and Path(ckpt_path).expanduser().absolute().is_relative_to(folder):
        return True
    restarted = int(environ.get("SLURM_RESTART_COUNT", "0") or 0) > 0
    return restarted and folder.name == slurm_name(dict(environ))


def _resume_point(checkpoints: list[Path]) -> Path:
    last = [path for path in checkpoints if path.name == "last.ckpt"]
    return (last or checkpoints)[0]


def _named(items: list) -> str:
    names = [Path(item).name for item in items[:_NAMED]]
    more = len(items) - len(names)
    return ", ".join(names) + (f" and {more} more" if more else "")
