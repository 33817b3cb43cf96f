"""The resume contract: a checkpoint is checked before anything is written, and a resume keeps
the settings that make it exact.

Hydra resolves ``hydra.run.dir=${run_folder:…,${ckpt_path}}`` (the resumed run's own folder) and
writes ``.hydra.resume_<n>`` and the log there before ``train(cfg)`` runs, so a wrong checkpoint
found by Lightning damaged the other run's folder. `ResumeContract` is a Hydra callback whose
``on_run_start`` runs after composition and before Hydra touches any folder. It refuses, in one
line (exit status 2):

- a ``ckpt_path`` (or ``init_from``) that cannot be loaded as a Lightning checkpoint: no file, a
  folder, zero bytes, a text file, half a file (`read_checkpoint`);
- a checkpoint of another task, or whose parameter names and shapes differ from the model this
  config builds (built on the meta device: no memory, no weights);
- on a resume, a change of a setting that breaks exactness (`EXACTNESS_KEYS`: model, data, batch
  sizes, optimizer, schedule, seed, precision), listing each ``key: old -> new`` and how to start a
  new run from the weights instead (``init_from=<ckpt>``). ``resume.allow_changes=true`` applies
  them, prints each one and records it as ``resume.changes`` in the resume's resolved config.
  Optimizer settings stay the checkpoint's even then (Lightning restores the optimizer's state,
  learning rate included), so they are set back in the config, which then records what trains.

The settings are compared with the newest config Hydra recorded in the checkpoint's run folder
(``.hydra/config.yaml``, ``.hydra.resume_<n>/config.yaml``), read as data (a run folder's files
are never resolved: an edited ``task_name: ${run_folder:/any/path}`` must create nothing), and
unresolved, as both were composed: a
``${hw.batch_size}`` that the profile settles compares equal to itself, and
``hw.batch_size`` (what the user sets) is compared instead.
"""

from __future__ import annotations

import copy
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from vramkit.core.config.instantiate import instantiate
from vramkit.core.config.schema import ConfigError
from vramkit.core.config.settings import Settings
from vramkit.core.config.source import ConfigSource, command_line_overrides
from vramkit.core.io.checkpoint_io import UnreadableCheckpointError, read_checkpoint
from vramkit.core.run.refusals import refusals_as_messages
from vramkit.core.run.run_folder import folder_of_checkpoint, read_run_file

EXACTNESS_KEYS = (
    "task_name",
    "model",
    "data",
    "seed",
    "batch_size_defaults.train",
    "hw.batch_size",
    "hw.accumulate_grad_batches",
    "hw.target_effective_batch",
    "hw.precision",
    "hw.devices",
    "hw.num_nodes",
    "trainer.precision",
    "trainer.accumulate_grad_batches",
    "trainer.devices",
    "trainer.num_nodes",
    "trainer.gradient_clip_val",
    "trainer.gradient_clip_algorithm",
)
"""Keys (and the keys below them) whose change makes a resumed run differ from an uninterrupted
one. Everything else (trainer.max_epochs, max_time, loggers, callbacks' intervals, paths, the
validation batch size) may change on a resume."""

KEPT_FROM_CHECKPOINT = ("model.optimizer",)
"""Exactness keys a resume cannot change even when allowed: Lightning restores the optimizer's
state, and its hyper-parameters (learning rate, weight decay, betas) with it."""

_MODEL_FLAGS = {"compile": False}
"""Model settings that change nothing in its parameters, set so that building it for the shape
check reads no hardware profile (``compile: ${hw.compile}`` needs one settled)."""

_ABSENT = "<absent>"
"""How a setting one of two configs lacks reads in a list of changes."""

_SHOWN_KEYS = 8
"""How many differing settings a refusal lists before it says how many more there are."""


class ResumeSettings(Settings):
    """``resume.*`` of conf/train.yaml: what a resume from ``ckpt_path`` may change."""

    allow_changes: bool = False
    """Apply changes of settings that break exactness (model, data, batch sizes, schedule, seed,
    precision) instead of refusing them; each is printed and recorded."""
    changes: tuple[str, ...] = ()
    """Written by a resume, not set by hand: each exactness-breaking change it applied
    (``key: old -> new``)."""


class ResumeContract(Callback):
    """Hydra callback: `enforce_resume_contract` before a single training run writes anything.

    ``eval.py`` writes into a folder of its own, never a checkpoint's: ``evaluate`` checks its
    checkpoint itself, whatever Hydra settings it runs under.
    """

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        if "train" not in config:  # not train.yaml's config
            return
        with refusals_as_messages():
            enforce_resume_contract(config)


def enforce_resume_contract(config: DictConfig) -> list[str]:
    """Check ``ckpt_path`` and ``init_from`` of ``config`` (a run's config, Hydra's node included
    or not) and return the changes applied to it on a resume (``key: old -> new``).

    Raises `ConfigError` for an unreadable checkpoint, one of another task or model shape, both
    keys at once, or exactness-breaking changes without ``resume.allow_changes=true``. With it,
    optimizer changes are set back to the checkpoint's values in ``config`` and every change is
    recorded in ``config.resume.changes``.
    """
    ckpt_path, init_from = config.get("ckpt_path"), config.get("init_from")
    if ckpt_path and init_from:
        raise ConfigError(
            "ckpt_path and init_from are both set: ckpt_path resumes a run, init_from starts a "
            "new one from a checkpoint's weights; keep one",
            ("ckpt_path", "init_from"),
        )
    key, path = ("ckpt_path", ckpt_path) if ckpt_path else ("init_from", init_from)
    task = _task_config(config)
    settings = resume_settings(task)  # a typo in resume.* is refused on any run
    if not path or config.get("backend", "torch") != "torch":
        return []
    checkpoint = _readable(key, Path(str(path)))
    recorded = _recorded_config(Path(str(path)))
    _check_same_model(key, Path(str(path)), checkpoint, task, recorded)
    if key != "ckpt_path" or not task.get("train", False):
        return []  # evaluation or new weights: nothing resumes
    changes = exactness_changes(recorded, task) if recorded is not None else []
    if not changes:
        return []
    if not settings.allow_changes:
        raise ConfigError(_refusal(Path(str(path)), changes), tuple(k for k, _, _ in changes))
    return _apply(config, changes)


def resume_settings(cfg: DictConfig) -> ResumeSettings:
    """``cfg.resume`` checked against `ResumeSettings` (defaults when the config has none)."""
    return ResumeSettings.from_config(
        cfg.get("resume") or {},
        key_prefix="resume.",
        source=ConfigSource("conf/train.yaml", command_line_overrides()),
    )


def load_initial_weights(model: torch.nn.Module, path: str | Path) -> None:
    """Copy the weights of the checkpoint at ``path`` into ``model`` (``init_from``: a new run
    from trained weights, with a fresh optimizer and schedule). Shapes were checked at start."""
    strict = getattr(model, "strict_loading", True)  # as Lightning loads it on a resume
    model.load_state_dict(read_checkpoint(path)["state_dict"], strict=strict)


def exactness_changes(
    previous: DictConfig | dict[str, Any], current: DictConfig
) -> list[tuple[str, Any, Any]]:
    """``(key, old, new)`` for each leaf under `EXACTNESS_KEYS` that differs between two configs
    (unresolved: interpolations compare as written); a missing key reads as `_ABSENT`."""
    old, new = _leaves(previous), _leaves(current)
    return [
        (key, old.get(key, _ABSENT), new.get(key, _ABSENT))
        for key in sorted(old.keys() | new.keys())
        if _breaks_exactness(key) and old.get(key, _ABSENT) != new.get(key, _ABSENT)
    ]


def _breaks_exactness(key: str) -> bool:
    return any(key == prefix or key.startswith(f"{prefix}.") for prefix in EXACTNESS_KEYS)


def _leaves(cfg: DictConfig | dict[str, Any]) -> dict[str, Any]:
    container = cfg if isinstance(cfg, dict) else OmegaConf.to_container(cfg, resolve=False)
    return dict(_walk(container, ""))


def _walk(node: Any, prefix: str) -> Iterator[tuple[str, Any]]:
    if isinstance(node, dict) and node:
        for name, value in node.items():
            yield from _walk(value, f"{prefix}{name}.")
    else:
        yield prefix.rstrip("."), node


def _task_config(config: DictConfig) -> DictConfig:
    # A copy without Hydra's node, as the run gets it: reading it must not touch the original.
    container = OmegaConf.to_container(config, resolve=False)
    container.pop("hydra", None)
    return OmegaConf.create(container)


def _readable(key: str, path: Path) -> dict[str, Any]:
    try:
        return read_checkpoint(path)
    except UnreadableCheckpointError as error:
        raise ConfigError(f"{key}: {error}", (key,)) from None


def _check_same_model(
    key: str,
    path: Path,
    checkpoint: dict[str, Any],
    task: DictConfig,
    recorded: dict[str, Any] | None,
) -> None:
    trained_with = _trained_with(path)
    their_task = recorded.get("task_name") if recorded is not None else None
    if their_task is not None and their_task != task.get("task_name"):
        raise ConfigError(
            f"{key} {path}: a checkpoint of task {their_task}, this run is task "
            f"{task.get('task_name')}{trained_with}",
            (key,),
        )
    model = _build_model(task)
    expected = {name: tuple(value.shape) for name, value in model.state_dict().items()}
    found = {name: tuple(value.shape) for name, value in checkpoint["state_dict"].items()}
    differences = _shape_differences(expected, found, strict=getattr(model, "strict_loading", True))
    if differences:
        raise ConfigError(f"{key} {path}: {differences}{trained_with}", (key,))


def _build_model(task: DictConfig) -> torch.nn.Module:
    task = task.copy()  # the flags below are for the shape check, not for the settings compared
    with open_dict(task):
        for flag, value in _MODEL_FLAGS.items():
            if flag in task.model.keys():  # noqa: SIM118 (`in` on the node resolves the value)
                task.model[flag] = value
    try:
        with torch.device("meta"):  # shapes only: no memory, no initialisation
            return instantiate(task.model)
    except Exception:  # a constructor that reads weights from a file cannot run on meta tensors
        return instantiate(task.model)


def _shape_differences(
    expected: dict[str, tuple[int, ...]], found: dict[str, tuple[int, ...]], *, strict: bool
) -> str:
    """What keeps ``found`` (the checkpoint's shapes) from loading into ``expected`` (the model's),
    or "" when it loads."""
    differ = [name for name in expected if name in found and found[name] != expected[name]]
    missing = [name for name in expected if name not in found] if strict else []
    unexpected = [name for name in found if name not in expected]
    parts = []
    if differ:
        first = differ[0]
        parts.append(
            f"{len(differ)} parameters differ in shape, first {first} "
            f"{_shape(found[first])} in the checkpoint vs {_shape(expected[first])} in this model"
        )
    if missing:
        parts.append(f"{len(missing)} parameters of this model are not in it, first {missing[0]}")
    if unexpected:
        parts.append(
            f"{len(unexpected)} of its parameters are not in this model, first {unexpected[0]}"
        )
    return "; ".join(parts)


def _shape(shape: tuple[int, ...]) -> str:
    return "[" + ",".join(str(size) for size in shape) + "]"


def _recorded_config(path: Path) -> dict[str, Any] | None:
    """The newest config Hydra recorded in the run folder of checkpoint ``path``, as data (its
    interpolations unresolved: `read_run_file`), or None."""
    folder = folder_of_checkpoint(path)
    if folder is None:
        return None
    records = [folder / ".hydra" / "config.yaml"]
    records += sorted(
        folder.glob(".hydra.resume_*/config.yaml"),
        key=lambda record: int(re.sub(r"\D", "", record.parent.suffix) or 0),
    )
    present = [record for record in records if record.is_file()]
    return read_run_file(present[-1]) if present else None


def _trained_with(path: Path) -> str:
    """ "; it was trained with task=…, model=…" from the Hydra record beside the checkpoint."""
    folder = folder_of_checkpoint(path)
    record = folder / ".hydra" / "hydra.yaml" if folder is not None else None
    if record is None or not record.is_file():
        return ""
    hydra = read_run_file(record).get("hydra")
    runtime = hydra.get("runtime") if isinstance(hydra, dict) else None
    choices = runtime.get("choices") if isinstance(runtime, dict) else None
    if not isinstance(choices, dict):
        return ""
    named = [f"{group}={choices[group]}" for group in ("task", "model") if choices.get(group)]
    return f"; it was trained with {', '.join(named)}" if named else ""


def _refusal(path: Path, changes: list[tuple[str, Any, Any]]) -> str:
    lines = [
        f"ckpt_path {path}: a resume continues the run exactly, and these settings differ from "
        "the run's:"
    ]
    lines += [f"  {key}: {old} -> {new}" for key, old, new in changes[:_SHOWN_KEYS]]
    if len(changes) > _SHOWN_KEYS:
        lines.append(f"  … and {len(changes) - _SHOWN_KEYS} more")
    lines.append(
        f"start a new run from its weights with init_from={path} (fresh optimizer, schedule and "
        "folder), resume with the run's settings, or apply them with resume.allow_changes=true"
    )
    return "\n".join(lines)


def _apply(config: DictConfig, changes: list[tuple[str, Any, Any]]) -> list[str]:
    applied = []
    with read_write(config), open_dict(config):
        for key, old, new in changes:
            if any(key == k or key.startswith(f"{k}.") for k in KEPT_FROM_CHECKPOINT):
                print(
                    f"resume: {key}: {old} -> {new} NOT applied: the optimizer's state, and its "
                    "settings, come from the checkpoint (init_from=<ckpt> starts afresh)",
                    file=sys.stderr,
                )
                _set_back(config, key, old)
                continue
            print(
                f"resume: applying {key}: {old} -> {new} (resume.allow_changes=true)",
                file=sys.stderr,
            )
            applied.append(f"{key}: {old} -> {new}")
        OmegaConf.update(config, "resume.changes", applied, force_add=True)
    return applied


def _set_back(config: DictConfig, key: str, old: Any) -> None:
    if old != _ABSENT:
        OmegaConf.update(config, key, copy.deepcopy(old), force_add=True)
        return
    parent, _, name = key.rpartition(".")
    node = OmegaConf.select(config, parent) if parent else config
    del node[name]
