"""The workload contract: what a task must and may give vramkit to be trained, planned and
recovered from an out-of-memory error.

A workload is one folder in ``vramkit/tasks/`` (its LightningModule, its LightningDataModule and
whatever they use) plus its conf files: ``conf/task/<name>.yaml`` (``# @package _global_``; it
picks the model and the data and states the task keys below), ``conf/model/<name>.yaml`` and
``conf/data/<name>.yaml``. vramkit reads a workload through this contract alone; `check_workload`
refuses a composed config that breaks it before any work, naming what is missing
(docs/add_a_workload.md shows a minimal workload).

Must:

- the model node's ``_target_`` builds a subclass of `MODULE_BASE` (`OOMResilientModule`: its
  steps survive an OOM) that defines each method of `MODULE_METHODS`;
- the data node's ``_target_`` builds a ``LightningDataModule`` that defines each method of
  `DATAMODULE_METHODS`, and the data node has the keys of `DATA_KEYS` (the profile's batch sizes);
- the composed config has the keys of `TASK_KEYS`.

May (each read where it is used, by the protocol named here):

- the module's class declares its metric names (`DeclaresLoggedMetrics`), so a monitored metric
  it never logs is refused before any work;
- the module overrides ``OOMResilientModule.micro_batch_weight`` for a loss that is not a mean
  over samples (tokens, answer cells), so a split step keeps the whole batch's gradients;
- the module draws pictures for the run's report (`DrawsReportFigures`);
- the datamodule sets itself up for the planner with less work than ``setup("fit")``
  (`PlanningSetup`), and its datasets state their item lengths (`ItemLengths`);
- the module inherits `ScheduledOptimization` (an optimizer factory and a warm-up/decay schedule
  from the model node's ``optimizer`` and ``lr_schedule``) for its ``configure_optimizers``;
- the task keys of `OPTIONAL_TASK_KEYS`.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping

import lightning as L
from omegaconf import DictConfig, OmegaConf

from vramkit.core.config.monitored_metrics import DeclaresLoggedMetrics
from vramkit.core.config.schema import ConfigError
from vramkit.core.config.source import closest, source_of
from vramkit.core.oom.resilient_module import OOMResilientModule
from vramkit.core.optim.scheduled_module import ScheduledOptimization
from vramkit.core.planner.tracing.batches import ItemLengths, PlanningSetup
from vramkit.core.report.task_figures import DrawsReportFigures

__all__ = [
    "DATAMODULE_METHODS",
    "DATA_KEYS",
    "GUIDE",
    "MODULE_BASE",
    "MODULE_METHODS",
    "OPTIONAL_TASK_KEYS",
    "TASK_KEYS",
    "DeclaresLoggedMetrics",
    "DrawsReportFigures",
    "ItemLengths",
    "PlanningSetup",
    "ScheduledOptimization",
    "check_workload",
    "workload_problems",
]

GUIDE = "docs/add_a_workload.md"
"""The page every refusal of this contract points to."""

MODULE_BASE = OOMResilientModule
"""The class a workload's LightningModule inherits: OOM recovery of its steps, and the fault
injection (``+fault.oom_train_above=N``) that rehearses it."""

MODULE_METHODS: Mapping[str, str] = {
    "training_step": "returns the loss of a batch (a tensor, or a dict with 'loss')",
    "validation_step": "logs val/ metrics, among them the task's optimized_metric",
    "configure_optimizers": "ScheduledOptimization gives one from the model node's optimizer",
}
"""The methods a workload's LightningModule defines (Lightning's own stubs do not count)."""

DATAMODULE_METHODS: Mapping[str, str] = {
    "train_dataloader": "training batches of data.batch_size",
    "val_dataloader": "validation batches of data.val_batch_size",
}
"""The methods a workload's LightningDataModule defines."""

DATA_KEYS: Mapping[str, str] = {
    "batch_size": "the training batch the profile decides: ${hw.batch_size}",
    "val_batch_size": "the validation batch the profile decides: ${hw.val_batch_size}",
}
"""The keys of the data node: the hardware profile sets the loaders' batch sizes through them."""

TASK_KEYS: Mapping[str, str] = {
    "task_name": "names the output folder and the runs",
    "optimized_metric": "what train() returns and checkpoints rank by, e.g. val/loss",
    "monitor_mode": "whether optimized_metric is better high (max) or low (min)",
    "batch_size_defaults.train": "the training batch `auto` means without a memory budget",
    "batch_size_defaults.val": "the validation batch `auto` means without a memory budget",
}
"""The config keys a task states (in conf/task/<name>.yaml), dotted below the config's root."""

OPTIONAL_TASK_KEYS: Mapping[str, str] = {
    "prediction_writer": "a node eval.py instantiates to save predictions; absent: metrics only",
    "onnx_backend": "a node eval.py backend=onnxruntime uses to run an export; absent: refused",
}
"""The config keys a task may state; vramkit reads them only where they are used."""

_MONITOR_MODES = ("max", "min")


def check_workload(cfg: DictConfig) -> None:
    """Raise one `ConfigError` (a one-line message) naming every piece of the contract that the
    composed `cfg`'s task, model and data lack; nothing is instantiated or resolved."""
    problems = workload_problems(cfg)
    if problems:
        raise ConfigError(
            f"the workload breaks its contract ({GUIDE}): "
            + "; ".join(problem for _, problem in problems),
            tuple(key for key, _ in problems),
        )


def workload_problems(cfg: DictConfig) -> list[tuple[str, str]]:
    """What the composed `cfg` lacks of the contract: (key, phrase naming key and file) pairs,
    empty when it keeps the contract."""
    problems = _task_key_problems(cfg, source_of("task").file)
    model, data = cfg.get("model"), cfg.get("data")
    problems += _class_problems(model, "model", L.LightningModule, MODULE_METHODS, MODULE_BASE)
    problems += _class_problems(data, "data", L.LightningDataModule, DATAMODULE_METHODS)
    if isinstance(data, DictConfig):
        problems += [
            (f"data.{key}", f"data.{key} is missing ({source_of('data').file}): {why}")
            for key, why in DATA_KEYS.items()
            if not _has_key(data, key)
        ]
    return problems


def _task_key_problems(cfg: DictConfig, file: str) -> list[tuple[str, str]]:
    present = _dotted_keys(cfg)
    unknown = [key for key in present if key not in TASK_KEYS]
    problems = []
    for key, why in TASK_KEYS.items():
        if _stated(cfg, key):
            continue
        near = closest(key, unknown)  # a misspelt key, such as batch_size_default.train
        hint = f"; did you mean {near}?" if near else ""
        problems.append((key, f"{key} is missing ({file}{hint}): {why}"))
    mode = cfg.get("monitor_mode")
    if mode is not None and mode not in _MONITOR_MODES:
        problems.append(("monitor_mode", f"monitor_mode={mode!r} ({file}) is neither max nor min"))
    return problems


def _class_problems(
    node: object, group: str, kind: type, methods: Mapping[str, str], base: type | None = None
) -> list[tuple[str, str]]:
    key, file = f"{group}._target_", source_of(group).file
    target = node.get("_target_") if isinstance(node, DictConfig) else None
    if not isinstance(target, str):
        return [(key, f"{key} is missing ({file}): the class of the workload's {group}")]
    built = _built_class(target)
    if built is None:
        return []  # a function or a bad path: instantiation names it with Hydra's own message
    named = f"{key}={target} ({file})"
    required = base or kind
    if not issubclass(built, required):
        return [(key, f"{named} is no {required.__name__} subclass")]
    return [
        (key, f"{named} does not define {method}: {why}")
        for method, why in methods.items()
        if getattr(built, method, None) is getattr(kind, method, None)  # Lightning's stub
    ]


def _built_class(target: str) -> type | None:
    """The class `target` names, or None for anything else (a factory function, a bad path).

    Imported here rather than by ``hydra.utils.get_class``, which logs an error of its own for
    a path that does not import, before instantiation reports it once more."""
    module_name, _, name = target.rpartition(".")
    try:
        built = getattr(importlib.import_module(module_name), name, None)
    except (ImportError, ValueError):
        return None
    return built if isinstance(built, type) else None


def _dotted_keys(cfg: DictConfig) -> list[str]:
    """The root's keys and their children's (``batch_size_defaults.train``), nothing resolved."""
    keys = []
    for key in cfg:
        keys.append(str(key))
        if OmegaConf.is_interpolation(cfg, key) or OmegaConf.is_missing(cfg, key):
            continue
        if isinstance(cfg[key], DictConfig):
            keys += [f"{key}.{child}" for child in cfg[key]]
    return keys


def _stated(cfg: DictConfig, dotted: str) -> bool:
    """`dotted` is a key of `cfg` whose value is not null; an interpolation counts as stated and
    is not resolved (it might read the hardware profile)."""
    parent, _, key = dotted.rpartition(".")
    node = OmegaConf.select(cfg, parent) if parent else cfg
    if not isinstance(node, DictConfig) or not _has_key(node, key):
        return False
    return OmegaConf.is_interpolation(node, key) or node[key] is not None


def _has_key(node: DictConfig, key: str) -> bool:
    """`key` is in `node`, its value unread: ``key in node`` resolves the value, and reading
    ``data.batch_size`` runs the memory planner on a GPU profile."""
    return key in node.keys()  # noqa: SIM118
