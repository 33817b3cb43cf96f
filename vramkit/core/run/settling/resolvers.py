"""The config's own resolvers. None of them plans or writes: the hardware profile's values are
plain ``${hw.…}`` interpolations, settled before the run's config is composed
(:mod:`vramkit.core.run.settling.settle`).

- ``${project_root:}``: the repository, where ``conf/``, ``data/`` and ``logs/`` live
  (``PROJECT_ROOT`` in the environment moves it; an installed package: the current folder).
- ``${conf_dir:}``: the config tree, in a checkout or in an installed package (`CONF_DIR`).
- ``${corpora_dir:}``: the small corpora shipped with vramkit (the topic sentences and their
  tokenizer), in a checkout or in an installed package (`CORPORA_DIR`).
- ``${run_folder:<runs folder>,${ckpt_path}}`` and ``${run_record:<run folder>,<name>}``: the name
  of a run folder of its own, the resumed run's folder again, and record names that keep the
  first run's (:mod:`vramkit.core.run.folder.run_folder`). They read the disk and write nothing:
  the run creates its folder (`vramkit.core.run.run_folder_guard.RunFolderGuard`).
"""

from __future__ import annotations

import os

from omegaconf import OmegaConf

from vramkit.core.config.conf_tree import CONF_DIR, PACKAGE_DIR, REPO_ROOT, shipped_folder
from vramkit.core.config.settings_schemas import register_settings_schemas
from vramkit.core.run.folder.run_folder import record_name, run_folder

__all__ = [
    "CONF_DIR",
    "CORPORA_DIR",
    "PACKAGE_DIR",
    "REPO_ROOT",
    "optuna_direction",
    "project_root",
    "register_resolvers",
]

CORPORA_DIR = shipped_folder("corpora")
"""The small corpora: ``corpora/`` of a checkout, or ``vramkit/corpora`` of an installed wheel."""


def register_resolvers() -> None:
    """Register the config's resolvers with OmegaConf, and its settings schemas with Hydra's
    ConfigStore (`register_settings_schemas`), which every composition needs (idempotent)."""
    register_settings_schemas()
    if not OmegaConf.has_resolver("project_root"):
        OmegaConf.register_new_resolver("project_root", project_root)
    if not OmegaConf.has_resolver("conf_dir"):
        OmegaConf.register_new_resolver("conf_dir", lambda: str(CONF_DIR))
    if not OmegaConf.has_resolver("corpora_dir"):
        OmegaConf.register_new_resolver("corpora_dir", lambda: str(CORPORA_DIR))
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
