"""Compare two runs and say which differences change training.

The brief's last report compared two training codes line by line to find the one change that
mattered (a 5% warm-up default). A run folder holds what that takes: `resolved_config.yaml` (every
value the run used), `overrides.txt` (the command line that composes it again: the user's
overrides, then the settlement's) and `run_environment.json` (code version, libraries, device).
The overrides only one of the runs has are listed first, as the user would type them; each
differing config key is classified:

- *changes training*: the model, loss and its weights, optimizer and learning rate, schedule and
  warm-up, precision, clipping, data and augmentation, seed, training length, and the global
  batch (micro-batch x accumulation x devices x nodes);
- *does not*: logging, loader workers and pinning, progress bars, checkpoint keeping,
  monitors, the hardware profile's own copy of values the trainer and data already carry, and
  micro-batch / accumulation / devices when the global batch is the same;
- *where files live*: a path, listed apart and never counted as a training change: `paths.*`,
  `hydra.run.dir`, `data.data_root`, any key named ``*_dir``, ``*_root``, ``*_path``,
  ``*_file`` or ``dir`` whose two values are paths (two runs of one command from two checkouts
  or clones differ there). The files found there are taken to be the same ones.

A key the rules do not know counts as changing training: a comparison that misses a change is
worse than one that asks the user to look.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from omegaconf import OmegaConf

from vramkit.core.run.folder.run_folder import RUN_CONFIG as CONFIG_NAME
from vramkit.core.run.folder.run_folder import RUN_OVERRIDES, read_run_overrides
from vramkit.core.run.records.run_record import RECORD_NAME

CHANGES = "changes training"
NEUTRAL = "does not change training"
LOCATION = "where files live"
"""The verdict of a path: never a training change, listed apart."""
RUN_FOLDER = "run folder"
"""The kind of a neutral difference that is only each run's own folder inside a path."""

# Key prefixes whose values never change what is learned (first match wins, before the rules below).
_NEUTRAL_PREFIXES = (
    "logger",
    "paths",
    "hydra",
    "hw",  # the profile; what it sets is compared where it lands (trainer.*, data.*)
    "task_name",
    "run_name",
    "tags",
    "optimized_metric",
    "monitor_mode",
    "batch_size_defaults",
    "prediction_writer",
    "onnx_backend",
    "ckpt_path",
    "callbacks.progress_bar",
    "callbacks.progress_line",
    "callbacks.model_checkpoint",
    "callbacks.last_checkpoint",
    "callbacks.checkpoint_retention",
    "callbacks.learning_rate_monitor",
    "callbacks.throughput_monitor",
    "callbacks.memory_monitor",
    "callbacks.bad_input_report",
    "callbacks.phase_memory_hygiene",
    "callbacks.oom_fault_injection",
    "callbacks.run_report",  # pictures after the fit
    "callbacks.model_summary",  # counts one step's FLOPs as it runs; changes no number
    "trainer.default_root_dir",
    "trainer.log_every_n_steps",
    "trainer.enable_progress_bar",
    "trainer.enable_model_summary",
    "trainer.enable_checkpointing",
    "trainer.num_sanity_val_steps",
    "trainer.check_val_every_n_epoch",
    "trainer.val_check_interval",
    "trainer.plugins",
    "trainer.strategy",
    "trainer.accelerator",
    "trainer.deterministic",
    "trainer.benchmark",
    "data.num_workers",
    "data.pin_memory",
    "data.prefetch_factor",
    "data.persistent_workers",
    "data.val_cache",
    "data.val_batch_size",
    "data.channels_last",
    "model.compile",
    "model.channels_last",
)
# The last part of a key that names a place on disk (a folder, a root, a file).
_LOCATION_SUFFIXES = ("_dir", "_root", "_path", "_file")
_LOCATION_NAMES = ("dir",)
# Key prefixes that are all places on disk (where runs, logs and data folders live).
_LOCATION_PREFIXES = ("paths",)
# Keys that make up the global batch: neutral when the product is unchanged.
_GLOBAL_BATCH_KEYS = (
    "data.batch_size",
    "trainer.accumulate_grad_batches",
    "trainer.devices",
    "trainer.num_nodes",
)
# What kind of training change a key is, by prefix or by a word in it (first match wins).
_KINDS = (
    ("model.optimizer", "optimizer"),
    ("model.lr_schedule", "schedule and warm-up"),
    ("model.scheduler", "schedule and warm-up"),
    ("callbacks.max_time_annealing", "schedule and warm-up"),
    ("trainer.precision", "precision"),
    ("trainer.gradient_clip", "clipping"),
    ("trainer.max_", "training length"),
    ("trainer.min_", "training length"),
    ("seed", "seed"),
    ("data.augment", "augmentation"),
    ("data.", "data"),
    ("model.", "model"),
)


@dataclass(frozen=True)
class KeyDifference:
    """One config key whose value differs between the two runs."""

    key: str
    before: Any
    after: Any
    verdict: str
    """`CHANGES`, `NEUTRAL` or `LOCATION`."""
    kind: str
    """What it is: optimizer, schedule and warm-up, loss, data, logging, global batch, ..."""


@dataclass
class RunComparison:
    """The differences between two runs, classified, and the one-line verdict."""

    differences: list[KeyDifference] = field(default_factory=list)
    environment: list[tuple[str, Any, Any]] = field(default_factory=list)
    global_batch: tuple[int | None, int | None] = (None, None)
    overrides: tuple[tuple[str, ...], tuple[str, ...]] = ((), ())
    """The overrides (`overrides.txt`) only the first run has, and only the second has."""

    @property
    def training_changes(self) -> list[KeyDifference]:
        """The differences that change what is trained."""
        return [d for d in self.differences if d.verdict == CHANGES]

    @property
    def equivalent(self) -> bool:
        """No config difference changes training (code and environment are reported apart)."""
        return not self.training_changes

    def verdict(self) -> str:
        """One line: equivalent, or what changes training."""
        changes = self.training_changes
        if not changes:
            note = " (code or environment differ: see above)" if self.environment else ""
            return f"equivalent: no difference changes training{note}"
        keys = ", ".join(d.key for d in changes[:4]) + (", ..." if len(changes) > 4 else "")
        return f"training differs: {len(changes)} change(s) ({keys})"


def load_run(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """`(flat config, run record)` of a run folder, or of the run folder a checkpoint is in."""
    path = Path(path)
    folder = path if path.is_dir() else _run_folder_of(path)
    config_path = folder / CONFIG_NAME
    if not config_path.is_file():
        raise FileNotFoundError(f"{path}: no {CONFIG_NAME} (not a vramkit run folder)")
    try:
        config = OmegaConf.to_container(OmegaConf.load(config_path), resolve=False)
    except yaml.YAMLError as error:
        raise ValueError(f"{config_path}: not readable YAML ({_first_line(error)})") from None
    if not isinstance(config, Mapping):
        raise ValueError(f"{config_path}: not a config (a {type(config).__name__}, not a mapping)")
    record_path = folder / RECORD_NAME
    try:
        record = json.loads(record_path.read_text()) if record_path.is_file() else {}
    except json.JSONDecodeError as error:
        raise ValueError(f"{record_path}: not readable JSON ({error})") from None
    return flatten(config), record


def load_overrides(path: Path) -> tuple[str, ...] | None:
    """The overrides of a run folder (or of the run folder a checkpoint is in), from its
    `overrides.txt`; None for a run recorded before runs wrote one."""
    path = Path(path)
    folder = path if path.is_dir() else _run_folder_of(path)
    record = folder / RUN_OVERRIDES
    return read_run_overrides(record) if record.is_file() else None


def _first_line(error: yaml.YAMLError) -> str:
    # PyYAML's message spans lines (problem, then the marks); its first mark says where.
    mark = getattr(error, "problem_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    problem = getattr(error, "problem", None) or str(error).splitlines()[0]
    return f"{problem}{where}"


def _run_folder_of(checkpoint: Path) -> Path:
    for folder in checkpoint.parents:
        if (folder / CONFIG_NAME).is_file():
            return folder
    raise FileNotFoundError(f"{checkpoint}: no {CONFIG_NAME} in the folders above it")


def flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    """`{"a.b.c": value}` for every leaf of a nested config (lists are leaves)."""
    if isinstance(node, Mapping):
        flat: dict[str, Any] = {}
        for key, value in node.items():
            flat.update(flatten(value, f"{prefix}{key}."))
        return flat if flat or not prefix else {prefix[:-1]: {}}
    return {prefix[:-1]: node}


def global_batch(config: Mapping[str, Any]) -> int | None:
    """Samples per optimizer step: micro-batch x accumulation x devices x nodes (None: unknown)."""
    micro = config.get("data.batch_size")
    devices = config.get("trainer.devices", 1)
    if isinstance(devices, (list, tuple)):
        devices = len(devices)
    factors = [
        micro,
        config.get("trainer.accumulate_grad_batches", 1),
        devices,
        config.get("trainer.num_nodes", 1),
    ]
    if not all(isinstance(factor, int) for factor in factors):
        return None
    product = 1
    for factor in factors:
        product *= factor
    return product


def compare(
    a: Mapping[str, Any],
    b: Mapping[str, Any],
    records=({}, {}),
    overrides: tuple[tuple[str, ...] | None, tuple[str, ...] | None] = (None, None),
) -> RunComparison:
    """Classify every difference between two flat configs (and their run records); list the
    overrides only one run has, where both recorded theirs."""
    result = RunComparison(global_batch=(global_batch(a), global_batch(b)))
    first, second = overrides
    if first is not None and second is not None:
        result.overrides = (
            tuple(o for o in first if o not in second),
            tuple(o for o in second if o not in first),
        )
    same_global_batch = result.global_batch[0] is not None and len(set(result.global_batch)) == 1
    for key in sorted(set(a) | set(b)):
        before, after = a.get(key, "<absent>"), b.get(key, "<absent>")
        if before == after:
            continue
        if key == "trainer.sync_batchnorm":
            result.differences.append(_sync_batchnorm(a, b))
            continue
        difference = _classify(key, before, after, same_global_batch)
        if difference.verdict == NEUTRAL and _only_run_folder(before, after, a, b):
            difference = KeyDifference(key, before, after, NEUTRAL, RUN_FOLDER)
        elif _is_location(key, before, after):
            difference = KeyDifference(key, before, after, LOCATION, "path")
        result.differences.append(difference)
    result.environment = _record_differences(*records)
    return result


def _classify(key: str, before: Any, after: Any, same_global_batch: bool) -> KeyDifference:
    if key in _GLOBAL_BATCH_KEYS:
        verdict = NEUTRAL if same_global_batch else CHANGES
        return KeyDifference(key, before, after, verdict, "global batch")
    if _matches(key, _NEUTRAL_PREFIXES):
        kind = key.split(".")[0] if "." in key else key
        return KeyDifference(key, before, after, NEUTRAL, kind)
    if "loss" in key.split("."):
        return KeyDifference(key, before, after, CHANGES, "loss and its weights")
    kind = next((name for prefix, name in _KINDS if key.startswith(prefix)), "unknown key")
    return KeyDifference(key, before, after, CHANGES, kind)


def _is_location(key: str, before: Any, after: Any) -> bool:
    """`key` names a place on disk and both values are paths (a string, or None/absent)."""
    last = key.rsplit(".", 1)[-1]
    named = (
        _matches(key, _LOCATION_PREFIXES)
        or last.endswith(_LOCATION_SUFFIXES)
        or last in _LOCATION_NAMES
    )
    return named and all(
        value is None or value == "<absent>" or isinstance(value, str) for value in (before, after)
    )


def _only_run_folder(before: Any, after: Any, a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Both values are paths that differ only by each run's own folder (`paths.output_dir`):
    every pair of runs has a handful of these, and listing them hides the differences that
    matter."""
    folder_a, folder_b = a.get("paths.output_dir"), b.get("paths.output_dir")
    if not all(isinstance(value, str) for value in (before, after, folder_a, folder_b)):
        return False
    moved = before.replace(folder_a, folder_b)
    return folder_a != folder_b and folder_a in before and moved == after


def _sync_batchnorm(a: Mapping[str, Any], b: Mapping[str, Any]) -> KeyDifference:
    """Synchronised BatchNorm over P processes normalises what one process at the same global
    batch does; without it, each process normalises its own share. So the key matters only where
    a run of several processes leaves it off."""
    key = "trainer.sync_batchnorm"
    unsynced_multi = any(
        config.get(key) is not True and (_world_size(config) or 1) > 1 for config in (a, b)
    )
    verdict = CHANGES if unsynced_multi else NEUTRAL
    return KeyDifference(
        key, a.get(key, "<absent>"), b.get(key, "<absent>"), verdict, "normalisation across devices"
    )


def _world_size(config: Mapping[str, Any]) -> int | None:
    devices = config.get("trainer.devices", 1)
    if isinstance(devices, (list, tuple)):
        devices = len(devices)
    nodes = config.get("trainer.num_nodes", 1)
    return devices * nodes if isinstance(devices, int) and isinstance(nodes, int) else None


def _matches(key: str, prefixes: tuple[str, ...]) -> bool:
    return any(key == prefix or key.startswith(prefix + ".") for prefix in prefixes)


def _record_differences(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[tuple[str, Any, Any]]:
    flat_a, flat_b = flatten(dict(a)), flatten(dict(b))
    if not flat_a or not flat_b:
        return []
    return [
        (key, flat_a.get(key), flat_b.get(key))
        for key in sorted(set(flat_a) | set(flat_b))
        if flat_a.get(key) != flat_b.get(key)
    ]


def report(comparison: RunComparison, names: tuple[str, str]) -> str:
    """The comparison as console lines, the verdict last."""
    lines = [f"comparing {names[0]} -> {names[1]}"]
    for name, only in zip(names, comparison.overrides, strict=True):
        if only:
            lines.append(f"overrides only {name} has ({RUN_OVERRIDES}): {' '.join(only)}")
    headings = {
        CHANGES: CHANGES,
        NEUTRAL: NEUTRAL,
        LOCATION: f"{LOCATION} (not a training change; the files there are taken to be the same)",
    }
    for verdict, heading in headings.items():
        rows = [d for d in comparison.differences if d.verdict == verdict]
        listed = [d for d in rows if d.kind != RUN_FOLDER]
        folder_only = len(rows) - len(listed)
        if rows:
            lines.append(f"{heading}:")
            lines += [f"  {d.key}: {d.before!r} -> {d.after!r}  [{d.kind}]" for d in listed]
        if folder_only:
            lines.append(f"  {folder_only} path(s) differ only by each run's own folder")
    before, after = comparison.global_batch
    if before != after or any(d.kind == "global batch" for d in comparison.differences):
        lines.append(f"global batch: {before} -> {after}")
    if comparison.environment:
        lines.append("code and environment (may change numerics; not counted above):")
        lines += [f"  {key}: {old!r} -> {new!r}" for key, old, new in comparison.environment]
    lines.append(comparison.verdict())
    return "\n".join(lines)
