"""Run folders: one per run, created atomically, and the same one again for a resumed run.

``conf/hydra/default.yaml`` names the run folder ``${run_folder:<runs folder>,${ckpt_path}}``.
A folder named only by the time (``${now:%Y-%m-%d_%H-%M-%S}``) is shared by two runs started in
the same second, which then overwrite each other's checkpoints and config. The resolver only
names a folder (`free_run_folder`: the time, or ``..._2``, ``..._3`` when a folder of that name
exists) and creates nothing, so reading a config (``--cfg job --resolve``,
``OmegaConf.to_container(cfg, resolve=True)``) leaves the disk as it was. The run creates its
folder in one place, after the checks that need none: the Hydra callback
`vramkit.core.run.run_folder_guard.RunFolderGuard`, before Hydra's ``run_job`` makes the folder
and writes into it. `create_run_folder` makes it with ``mkdir`` that fails when it exists (atomic
on POSIX file systems, NFS included): a run that finds its name taken by a run started in the
same second takes the next suffix instead. A run resumed from ``<run>/checkpoints/*.ckpt`` writes
into ``<run>`` again, with its own config records beside the first ones.

Under SLURM the folder is named after the job (``slurm-<job id>[_<array task>]``), and a requeued
job (``SLURM_RESTART_COUNT`` >= 1) gets its folder back, where Lightning's requeue checkpoint
(``hpc_ckpt_<n>.ckpt`` in ``default_root_dir``) and ``last.ckpt`` wait for it.

A multirun job's folder is ``<sweep folder>/<job number>``; a job that submitit requeues
(``hydra/launcher=slurm``) gets it back because the sweep folder was resolved once, before the
jobs were pickled, and travels in the launcher's config with its resolver cache
(:mod:`vramkit.core.run.folder.requeue`).

While a run (or a sweep) lives it holds a lock on its folder, and a refusal before any work
removes the folder it claimed (:mod:`vramkit.core.run.run_folder_guard`); ``CREATED`` tells the
folders this process made from those it found.
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml
from omegaconf import OmegaConf

from vramkit.core.config.schema import ConfigError

RUN_CONFIG = "resolved_config.yaml"
"""The config a run used, written into its folder (a resumed run's get a ``resume_<n>`` name)."""

RUN_OVERRIDES = "overrides.txt"
"""The overrides that compose a run's config, one a line: the user's, then the settlement's
(:mod:`vramkit.core.run.settling.settle`); a resumed run's get a ``resume_<n>`` name."""

CHECKPOINTS = "checkpoints"
"""The folder of a run's checkpoints (``callbacks.*.dirpath``)."""


def run_folder(runs_dir: str, ckpt_path: str | None = None) -> str:
    """The folder of this run: the resumed run's own, else a free name in ``runs_dir``
    (`free_run_folder`). Creates nothing: the run creates it (`create_run_folder`).

    Registered with OmegaConf's resolver cache (``use_cache=True``), like Hydra's ``now``: Hydra
    copies a config's cache into every job config of a multirun (``load_sweep_config``), also
    to launchers that run jobs in other processes, so all jobs share one sweep folder.
    """
    if ckpt_path:
        folder = folder_of_checkpoint(Path(ckpt_path))
        if folder is not None:
            return str(folder)
    return str(free_run_folder(Path(runs_dir), time.time(), dict(os.environ)))


def folder_of_checkpoint(checkpoint: Path) -> Path | None:
    """The run folder ``checkpoint`` lies in (``<run>/checkpoints/<name>.ckpt`` of a run that
    wrote its config), else None."""
    checkpoint = checkpoint.expanduser().absolute()
    if checkpoint.parent.name != CHECKPOINTS:
        return None
    folder = checkpoint.parent.parent
    return folder if (folder / RUN_CONFIG).is_file() else None


def free_run_folder(runs_dir: Path, now: float, environ: dict[str, str]) -> Path:
    """A folder in ``runs_dir`` that does not exist yet, named by the local time ``now`` (seconds
    since the epoch) or by the SLURM job in ``environ``, a taken name with a suffix; a requeued
    SLURM job's own folder. Only reads the disk."""
    name = slurm_name(environ) or time.strftime("%Y-%m-%d_%H-%M-%S", time.localtime(now))
    if name.startswith("slurm-") and int(environ.get("SLURM_RESTART_COUNT", "0") or 0) > 0:
        return runs_dir / name
    return next(folder for folder in _suffixed(runs_dir / name) if not folder.exists())


def create_run_folder(folder: Path) -> Path:
    """Create ``folder`` (and the folders above it) and return it; when another run created it
    since it was named, the first free suffixed name instead (``<name>_2``, ``<name>_3``), each
    tried with an ``mkdir`` that fails on an existing folder, so no two runs get one folder."""
    folder = Path(folder).absolute()
    missing = [p for p in folder.parents if not p.exists()]
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise _unwritable(folder.parent, error) from None
    for candidate in _suffixed(folder):
        try:
            candidate.mkdir()
        except FileExistsError:
            continue
        except OSError as error:
            raise _unwritable(folder.parent, error) from None
        CREATED[candidate] = missing[-1] if missing else candidate
        return candidate
    raise AssertionError("unreachable")  # _suffixed never ends


def _suffixed(folder: Path) -> Iterator[Path]:
    """``folder``, then ``<folder>_2``, ``<folder>_3``, ..."""
    yield folder
    for attempt in itertools.count(2):
        yield folder.with_name(f"{folder.name}_{attempt}")


CREATED: dict[Path, Path] = {}
"""Run folders this process created, each with the topmost folder it created for it (the folder
itself, or a runs folder above it that did not exist): a refusal before any work removes them."""


def _unwritable(runs_dir: Path, error: OSError) -> ConfigError:
    """A runs folder that cannot be made or written (read-only, a file in its path) is the
    user's ``paths.log_dir`` to change, not a traceback."""
    return ConfigError(
        f"paths.log_dir (conf/paths/default.yaml): cannot create a run folder in {runs_dir} "
        f"({error.strerror}); set paths.log_dir=<a folder you can write to>",
        ("paths.log_dir",),
    )


def slurm_name(environ: dict[str, str]) -> str | None:
    """The run folder name of the SLURM job in ``environ`` (``slurm-<job id>[_<array task>]``),
    or None outside SLURM."""
    job = environ.get("SLURM_ARRAY_JOB_ID") or environ.get("SLURM_JOB_ID")
    if not job:
        return None
    task = environ.get("SLURM_ARRAY_TASK_ID")
    return f"slurm-{job}_{task}" if environ.get("SLURM_ARRAY_JOB_ID") and task else f"slurm-{job}"


def record_name(folder: str | Path, name: str) -> str:
    """``name`` (a file or folder in the run folder ``folder``) when it is free, else
    ``<stem>.resume_<n><suffix>`` with the first free n (``resolved_config.resume_1.yaml``,
    ``.hydra.resume_1``): a resumed run keeps the first run's records."""
    folder, path = Path(folder), Path(name)
    if not (folder / name).exists():
        return name
    for n in itertools.count(1):
        candidate = f"{path.stem}.resume_{n}{path.suffix}"
        if not (folder / candidate).exists():
            return candidate
    raise AssertionError("unreachable")  # itertools.count never ends


def read_run_file(path: str | Path) -> dict[str, Any]:
    """A YAML record of a run folder (``.hydra/config.yaml``, ``resolved_config.yaml``) as plain
    data: strings stay strings, so a ``${...}`` in it is never resolved (a resolver such as
    ``run_folder`` reads the disk) and nothing in it is instantiated; {} when it holds no
    mapping, or is not YAML."""
    try:  # parsed as OmegaConf parses it (its float rule), converted without resolving
        data = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
    except (OSError, yaml.YAMLError):
        return {}
    return data if isinstance(data, dict) else {}


def read_run_overrides(path: str | Path) -> tuple[str, ...]:
    """The overrides a run folder's ``overrides.txt`` (``path``) records, in order."""
    return tuple(line for line in Path(path).read_text().splitlines() if line.strip())
