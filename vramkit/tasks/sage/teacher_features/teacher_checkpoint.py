"""Finding, hashing and loading the teacher: the embedded one or any plug-in ``nn.Module``.

A teacher is an ``nn.Module`` with ``feature_width`` (int) and ``encode_inputs(batch)`` returning
(B, L, feature_width) features, one per input token of the grid-token batch (the keys of
``vramkit.tasks.sage.data.arc_examples.INPUT_KEYS``; the answer is never in it). A teacher that also
has ``predict(batch) -> GridPrediction`` is scored next to the student (and one with
``encode_and_predict(batch) -> (features, GridPrediction)`` gives both from one pass).

- The embedded teacher: a checkpoint of ``python train.py task=arc_teacher``; it names its own
  network class and sizes (``TEACHER_NETWORK_KEY``), so no config is needed to load it. A file
  is data, not config: the network it names is built only when it is one of vramkit's SAGE
  networks (`OWN_NETWORKS`) and its arguments are plain values (no nested ``_target_``, no
  ``${...}`` interpolation, which Hydra's ``instantiate`` would resolve), by calling the class
  itself rather than ``instantiate``. The file itself is read weights-only
  (`vramkit.core.run.checkpoint_setting.weights_setting`).
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
from vramkit.core.run.checkpoint_setting import weights_setting
from vramkit.tasks.sage.teacher_features.commands import TEACHER_ENTRY, suggest_command

LATEST = "latest"  # teacher.checkpoint value: the newest arc_teacher run's last.ckpt
TEACHER_NETWORK_KEY = "sage_teacher_network"  # checkpoint entry: {_target_, **init kwargs}
TEACHER_TASK = "arc_teacher"
OWN_NETWORKS = "vramkit.tasks.sage."
"""The package whose network classes a file (checkpoint, cache manifest) may name."""


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
    net_config_file: Path | None = None,
) -> LoadedTeacher:
    """Build the teacher and load its weights from ``checkpoint``.

    Without ``net_config`` the checkpoint must come from ``task=arc_teacher`` (it names its
    network); ``state_dict_prefix`` defaults to ``net.`` there and to none for a plug-in.
    ``net_config_file``: the file ``net_config`` was read from (a feature cache's manifest),
    which makes it data, built as `network_from_file` builds a checkpoint's network.
    """
    state = weights_setting("teacher.checkpoint", checkpoint)
    if net_config is None:
        config = state.get(TEACHER_NETWORK_KEY) if isinstance(state, Mapping) else None
        if config is None:
            raise ValueError(
                f"{checkpoint} is not a task=arc_teacher checkpoint (it has no "
                f"{TEACHER_NETWORK_KEY}); for another teacher set teacher.net._target_=<class>"
            )
        prefix = "net." if state_dict_prefix is None else state_dict_prefix
        config, teacher = network_from_file(config, f"teacher.checkpoint: {checkpoint}")
    elif net_config_file is not None:
        prefix = state_dict_prefix or ""
        config, teacher = network_from_file(net_config, str(net_config_file))
    else:
        if isinstance(net_config, DictConfig):
            net_config = OmegaConf.to_container(net_config, resolve=True)
        config = upgrade_targets(dict(net_config))  # a teacher of vramkit's first layout
        prefix = state_dict_prefix or ""
        importlib.import_module(_module_of(config))  # a clear ImportError before Hydra's own
        teacher = instantiate(config)
    check_teacher_interface(teacher, f"teacher {config['_target_']}")
    teacher.load_state_dict(_state_dict(state, prefix))
    return LoadedTeacher(module=teacher.eval(), config=config, state_dict_prefix=prefix)


def network_from_file(config: Any, source: str) -> tuple[dict[str, Any], nn.Module]:
    """The config node a file holds (``{_target_, **arguments}``, old targets upgraded) and the
    network it names, built by calling its class, which must be an ``nn.Module`` of
    `OWN_NETWORKS`, with plain-value arguments.

    ``source`` names the file for the `ConfigError` a refused node raises (it runs nothing)."""
    if not isinstance(config, Mapping):
        raise ConfigError(f"{source}: its network is not a config node ({type(config).__name__})")
    config = upgrade_targets(dict(config))  # a teacher saved by vramkit's first layout
    target = str(config.get("_target_", ""))
    if not target.startswith(OWN_NETWORKS):
        raise ConfigError(
            f"{source}: its network {target!r} is not one of vramkit's SAGE networks "
            f"({OWN_NETWORKS}*); a file's network is built only from vramkit's own classes (for "
            "another teacher set teacher.net._target_=<class>)",
            ("teacher.checkpoint",),
        )
    arguments = {key: value for key, value in config.items() if key != "_target_"}
    unsafe = _not_plain(arguments)
    if unsafe:
        raise ConfigError(
            f"{source}: network argument {unsafe} is not a plain value (a file's network "
            "arguments are numbers, strings and lists of them)",
            ("teacher.checkpoint",),
        )
    module_name, _, class_name = target.rpartition(".")
    network = getattr(importlib.import_module(module_name), class_name, None)
    if not (isinstance(network, type) and issubclass(network, nn.Module)):
        raise ConfigError(f"{source}: {target} is not a network class", ("teacher.checkpoint",))
    return config, network(**arguments)


def _not_plain(node: Any, path: str = "") -> str | None:
    """The first argument (dotted path) of ``node`` that is no plain value, or None."""
    if isinstance(node, Mapping):
        for key, value in node.items():
            if not isinstance(key, str) or key.startswith("_"):
                return f"{path}{key}"
            found = _not_plain(value, f"{path}{key}.")
            if found:
                return found
        return None
    if isinstance(node, (list, tuple)):
        for index, value in enumerate(node):
            found = _not_plain(value, f"{path}{index}.")
            if found:
                return found
        return None
    if node is None or isinstance(node, (bool, int, float)):
        return None
    if isinstance(node, str) and "${" not in node:
        return None
    return path.rstrip(".") or repr(node)


def _module_of(config: Mapping[str, Any]) -> str:
    module_name, _, _ = str(config.get("_target_", "")).rpartition(".")
    if not module_name:
        raise ValueError(f"teacher network config has no _target_: {config}")
    return module_name
