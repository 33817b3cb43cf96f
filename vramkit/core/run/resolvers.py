"""The config's own resolvers, so that the composed config is the run.

- ``${resolved_hw:batch_size}``: a field of the hardware profile as the run uses it: detected when
  no ``+hw=`` was given, ``auto`` batch sizes planned, accumulation derived. The trainer, data,
  model and callback configs read the profile through it, so
  ``python train.py +hw=t4 --cfg job --resolve`` prints the batch sizes, precision and workers a
  run on a T4 uses, without starting one.
- ``${project_root:}``: the repository, where ``conf/``, ``data/`` and ``logs/`` live
  (``PROJECT_ROOT`` in the environment moves it; an installed package: the current folder).
- ``${conf_dir:}``: the config tree, in a checkout or in an installed package (`CONF_DIR`).
- ``${run_folder:<runs folder>,${ckpt_path}}`` and ``${run_record:<run folder>,<name>}``: a run
  folder of its own, the resumed run's folder again, and record names that keep the first run's
  (:mod:`vramkit.core.run.run_folder`).
"""

from __future__ import annotations

import os
import weakref
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from vramkit.core.hardware.profile import FIELD_NAMES, HardwareProfile
from vramkit.core.hardware.settled import reads_hw_node
from vramkit.core.run.resolve_hardware import resolve_hardware
from vramkit.core.run.run_folder import record_name, run_folder

REPO_ROOT = Path(__file__).resolve().parents[3]
"""The repository (an editable install's checkout): where ``conf/`` lives."""

CONF_DIR = (Path(__file__).resolve().parents[2] / "conf").resolve()
"""The config tree: in a checkout ``vramkit/conf`` links to the repository's ``conf/`` (resolved
to it, so messages name ``conf/...``); an installed wheel ships it as package data there."""

# Previews: configs resolved by something other than a run (``--cfg job --resolve``, a test that
# instantiates a node), each planned once. Keyed by id, with a weak reference that tells a live
# config from a dead one whose id was reused.
_previews: dict[int, tuple[weakref.ref, HardwareProfile]] = {}


def register_resolvers() -> None:
    """Register the config's resolvers with OmegaConf (idempotent)."""
    if not OmegaConf.has_resolver("resolved_hw"):
        OmegaConf.register_new_resolver("resolved_hw", resolved_hw)
    if not OmegaConf.has_resolver("project_root"):
        OmegaConf.register_new_resolver("project_root", project_root)
    if not OmegaConf.has_resolver("conf_dir"):
        OmegaConf.register_new_resolver("conf_dir", lambda: str(CONF_DIR))
    if not OmegaConf.has_resolver("optuna_direction"):
        OmegaConf.register_new_resolver("optuna_direction", optuna_direction)
    if not OmegaConf.has_resolver("run_folder"):
        OmegaConf.register_new_resolver("run_folder", run_folder, use_cache=True)
    if not OmegaConf.has_resolver("run_record"):
        OmegaConf.register_new_resolver("run_record", record_name)


def optuna_direction(monitor_mode: str) -> str:
    """Optuna's study direction for a task's ``monitor_mode``: max → maximize, min → minimize."""
    directions = {"max": "maximize", "min": "minimize"}
    if monitor_mode not in directions:
        raise ValueError(f"monitor_mode must be max or min, got {monitor_mode!r}")
    return directions[monitor_mode]


def project_root() -> str:
    """``PROJECT_ROOT`` from the environment, else the repository holding ``conf/``; an installed
    package (its configs are package data) keeps data and logs below the current folder."""
    if os.environ.get("PROJECT_ROOT"):
        return os.environ["PROJECT_ROOT"]
    return str(REPO_ROOT) if CONF_DIR == REPO_ROOT / "conf" else os.getcwd()


def resolved_hw(key: str, _root_: DictConfig) -> Any:
    """The run's value of hardware profile field ``key`` for the config ``_root_``.

    A run settles its profile first (``resolve_hardware`` checks the device, plans, and writes
    the result into ``cfg.hw``); from then on this reads ``cfg.hw``. While it is being settled
    (the planner builds the datamodule from this very config), the profile as given is read. A
    config nobody settled (``--cfg job``) is settled for a preview: on a copy, for the profile's
    own hardware (no device check, no memory cap), as ``scripts/plan_memory.py`` plans.
    """
    if key not in FIELD_NAMES:
        raise KeyError(f"resolved_hw: unknown hardware profile field {key!r}")
    if reads_hw_node(_root_):
        return _root_.hw[key]
    if "hydra" in _root_ or "paths" not in _root_:
        # Not a composed job config: still being composed (a job's config never holds Hydra's
        # own node; a merge peeks at values before `+hw=` is merged), or Hydra's record of the
        # overrides. Either must get an error, not a profile planned too early.
        raise ValueError("resolved_hw is read once the config is composed")
    return getattr(_preview(_root_), key)


def _preview(root: DictConfig) -> HardwareProfile:
    entry = _previews.get(id(root))
    if entry is not None and entry[0]() is root:
        return entry[1]
    copy = OmegaConf.create(OmegaConf.to_container(root, resolve=False))
    profile = resolve_hardware(copy, conf_dir=Path(root.paths.conf_dir), check_device=False)
    _previews[id(root)] = (weakref.ref(root), profile)
    return profile
