"""Finding, hashing and loading the teacher: the embedded one or any plug-in ``nn.Module``.

A teacher is an ``nn.Module`` with ``feature_width`` (int) and ``encode_inputs(batch)`` returning
(B, L, feature_width) features, one per input token of the grid-token batch (the keys of
``vramkit.tasks.sage.arc_examples.INPUT_KEYS``; the answer is never in it). A teacher that also
has ``predict(batch) -> GridPrediction`` is scored next to the student (and one with
``encode_and_predict(batch) -> (features, GridPrediction)`` gives both from one pass).

- The embedded teacher: a checkpoint of ``python train.py task=arc_teacher``; it names its own
  network class and sizes (``TEACHER_NETWORK_KEY``), so no config is needed to load it.
- A plug-in teacher: ``teacher.net`` is a config node with ``_target_`` (e.g. an adapter around
  a vision-language model that pools its features per grid cell) and ``teacher.checkpoint`` a
  local weights file: a plain ``state_dict`` or a Lightning checkpoint whose ``state_dict`` keys
  carry ``teacher.state_dict_prefix``.
"""

from __future__ import annotations

import hashlib
import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from torch import nn

from vramkit.core.config.legacy_targets import upgrade_targets
from vramkit.core.config.schema import ConfigError
from vramkit.tasks.sage.commands import TEACHER_ENTRY, suggest_command

LATEST = "latest"  # teacher.checkpoint value: the newest arc_teacher run's last.ckpt
TEACHER_NETWORK_KEY = "sage_teacher_network"  # checkpoint entry: {_target_, **init kwargs}
TEACHER_TASK = "arc_teacher"


class MissingTeacherError(ConfigError, FileNotFoundError):
    """No teacher checkpoint where ``teacher.checkpoint`` points: a refusal (one line, exit 2, no
    run folder) that names the command training one, raised before any work when the planner or
    the run first builds the student's data."""


def network_config(net: nn.Module) -> dict[str, Any]:
    """A config node (``_target_`` + constructor arguments) that rebuilds ``net``."""
    kwargs = getattr(net, "init_kwargs", None)
    if kwargs is None:
        raise TypeError(f"{type(net).__name__} has no init_kwargs: it cannot describe itself")
    cls = type(net)
    return {"_target_": f"{cls.__module__}.{cls.__qualname__}", **kwargs}


def file_sha256(path: Path) -> str:
    """Hex sha256 of a file's bytes (read in 16 MiB blocks)."""
    digest = hashlib.sha256()
    with Path(path).open("rb") as handle:
        while block := handle.read(1 << 24):
            digest.update(block)
    return digest.hexdigest()


def find_latest_teacher(log_dir: Path) -> Path | None:
    """The most recently written ``<log_dir>/arc_teacher/**/checkpoints/last.ckpt``, if any."""
    candidates = list((Path(log_dir) / TEACHER_TASK).glob("**/checkpoints/last.ckpt"))
    return max(candidates, key=lambda p: p.stat().st_mtime) if candidates else None


def resolve_teacher_checkpoint(value: str, *, log_dir: Path) -> Path:
    """``teacher.checkpoint`` as an existing file; ``latest`` looks under ``log_dir``.

    Raises MissingTeacherError (a FileNotFoundError) with the command that trains a teacher.
    """
    command = suggest_command(TEACHER_ENTRY, task=TEACHER_TASK)
    if str(value) == LATEST:
        found = find_latest_teacher(log_dir)
        if found is None:
            raise MissingTeacherError(
                f"teacher.checkpoint=latest: no teacher checkpoint under "
                f"{Path(log_dir) / TEACHER_TASK}; train one with `{command}` "
                f"or set teacher.checkpoint=<path to a checkpoint>",
                ("teacher.checkpoint",),
            )
        return found
    path = Path(value)
    if not path.is_file():
        raise MissingTeacherError(
            f"teacher.checkpoint: no file at {path}; train a teacher with `{command}` "
            f"or point teacher.checkpoint at an existing checkpoint",
            ("teacher.checkpoint",),
        )
    return path


def _state_dict(state: Mapping[str, Any], prefix: str) -> dict[str, torch.Tensor]:
    weights = state.get("state_dict", state)
    if not prefix:
        return dict(weights)
    stripped = {k[len(prefix) :]: v for k, v in weights.items() if k.startswith(prefix)}
    if not stripped:
        raise KeyError(f"no weights start with teacher.state_dict_prefix={prefix!r}")
    return stripped


def check_teacher_interface(teacher: nn.Module, where: str) -> None:
    """TypeError naming ``where`` unless ``teacher`` has ``feature_width`` and ``encode_inputs``."""
    width = getattr(teacher, "feature_width", None)
    if not callable(getattr(teacher, "encode_inputs", None)) or not isinstance(width, int):
        raise TypeError(
            f"{where}: a teacher needs an int `feature_width` and `encode_inputs(batch)` returning "
            f"(B, L, feature_width) features per input token; {type(teacher).__name__} lacks them"
        )


@dataclass
class LoadedTeacher:
    """A teacher in eval mode on the CPU, with what rebuilds it from its checkpoint."""

    module: nn.Module
    config: dict[str, Any]  # config node: _target_ and constructor arguments
    state_dict_prefix: str  # prefix of its weights in the checkpoint's state_dict


def load_teacher(
    checkpoint: Path,
    net_config: Mapping[str, Any] | DictConfig | None = None,
    *,
    state_dict_prefix: str | None = None,
) -> LoadedTeacher:
    """Build the teacher and load its weights from ``checkpoint``.

    Without ``net_config`` the checkpoint must come from ``task=arc_teacher`` (it names its
    network); ``state_dict_prefix`` defaults to ``net.`` there and to none for a plug-in.
    """
    state = torch.load(checkpoint, map_location="cpu", weights_only=True)
    if net_config is None:
        config = state.get(TEACHER_NETWORK_KEY) if isinstance(state, Mapping) else None
        if config is None:
            raise ValueError(
                f"{checkpoint} is not a task=arc_teacher checkpoint (it has no "
                f"{TEACHER_NETWORK_KEY}); for another teacher set teacher.net._target_=<class>"
            )
        prefix = "net." if state_dict_prefix is None else state_dict_prefix
    else:
        if isinstance(net_config, DictConfig):
            net_config = OmegaConf.to_container(net_config, resolve=True)
        config = dict(net_config)
        prefix = state_dict_prefix or ""
    config = upgrade_targets(config)  # a teacher saved by vramkit's first layout still loads
    module_name, _, class_name = str(config.get("_target_", "")).rpartition(".")
    if not module_name:
        raise ValueError(f"teacher network config has no _target_: {config}")
    importlib.import_module(module_name)  # a clear ImportError before Hydra's wrapped one
    teacher = instantiate(config)
    check_teacher_interface(teacher, f"teacher {module_name}.{class_name}")
    teacher.load_state_dict(_state_dict(state, prefix))
    return LoadedTeacher(module=teacher.eval(), config=config, state_dict_prefix=prefix)
