"""The resume contract: a checkpoint is checked before anything is written, and a resume trains
what the checkpoint's run trained.

Hydra resolves ``hydra.run.dir=${run_folder:…,${ckpt_path}}`` (the resumed run's own folder) and
writes ``.hydra.resume_<n>`` and the log there before ``train(cfg)`` runs, so a wrong checkpoint
found by Lightning damaged the other run's folder. `ResumeContract` is a Hydra callback whose
``on_run_start`` runs after composition and before Hydra touches any folder. It refuses, in one
message (exit status 2):

- a ``ckpt_path`` (or ``init_from``) that cannot be loaded as a Lightning checkpoint: no file, a
  folder, zero bytes, a text file, half a file (`read_checkpoint`);
- a checkpoint of another task, or whose parameter names and shapes differ from the model this
  config builds (built on the meta device: no memory, no weights);
- on a resume, a change of a composed setting that decides what trains (`COMPOSED_KEYS`: model,
  optimizer, schedule, data, seed, clipping, accumulation as set), listing each ``key: old ->
  new`` and how to start a new run from the weights instead (``init_from=<ckpt>``).

The settings are compared with the contract the checkpoint carries (`CONTRACT_KEY`, written into
every checkpoint by `vramkit.core.callbacks.checkpoints.checkpoint_contract.CheckpointContract`), so
a
checkpoint copied without its run folder is checked too; a checkpoint written before contracts
existed is compared with the newest config its run folder recorded, read as data (a run folder's
files are never resolved: an edited ``task_name: ${run_folder:/any/path}`` must create nothing).
Both are unresolved, as composed: ``${hw.batch_size}`` compares equal to itself; only a class
default (``${settings_default:…}``) is read as its value, on both sides, so a run recorded with
the numbers before the YAML left them to the settings classes resumes unchanged. What the profile
settles is compared after settling (`keep_trained_batch`, called by ``train()``): the samples per
optimizer step (per-device batch × accumulation × processes) are kept (batch 4 → batch 1 × 4
accumulated when this machine fits less), and a change of processes or precision is refused in one
line.

``resume.allow_changes=true`` applies every change it lists: `check_resume` returns them as a
`ResumeVerdict`, which ``train()`` prints and records as ``resume.changes`` (the callback checks
and changes nothing); the model, data and clipping by building from the new config, the optimizer's
settings (the learning rate included, scaling its schedule) and vramkit's schedule after the
checkpoint's optimizer state is loaded (`CheckpointContract`). What it cannot apply is refused even
then: a seed (the random streams and the data order continue from the checkpoint), another
optimizer class (the checkpoint's state is of its own), another number of processes (loader
positions count per process).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf, open_dict

from vramkit.core.callbacks.checkpoints.checkpoint_contract import CONTRACT_KEY
from vramkit.core.config.instantiate import instantiate
from vramkit.core.config.schema import ConfigError
from vramkit.core.config.settings import Settings
from vramkit.core.config.settings_schemas import OWN_COMPONENTS, with_class_defaults
from vramkit.core.config.source import ConfigSource, command_line_overrides, override_key
from vramkit.core.hardware.profile import HardwareProfile
from vramkit.core.io.checkpoint_io import UnreadableCheckpointError, read_checkpoint
from vramkit.core.quantization.planned_linear import PlannedQuantizedLinear
from vramkit.core.run.folder.run_folder import folder_of_checkpoint, read_run_file
from vramkit.core.run.refusal.exit_codes import refusals_as_messages
from vramkit.core.run.settling.settle import Settlement, override_text

COMPOSED_KEYS = (
    "task_name",
    "model",
    "data",
    "seed",
    "hw.accumulate_grad_batches",
    "hw.target_effective_batch",
    "trainer.accumulate_grad_batches",
    "trainer.gradient_clip_val",
    "trainer.gradient_clip_algorithm",
)
"""Composed keys (and the keys below them) whose change makes a resumed run differ from an
uninterrupted one. The batch, processes and precision are compared as settled instead
(`keep_trained_batch`); everything else (trainer.max_epochs, max_time, loggers, callbacks'
intervals, paths, the validation batch size) may change on a resume."""

MAY_CHANGE = (
    "data.num_workers",
    "data.pin_memory",
    "data.prefetch_factor",
    "data.persistent_workers",
    "data.val_batch_size",
    "data.val_cache",
    "data.channels_last",
    "model.channels_last",
)
"""Keys under `COMPOSED_KEYS` that change how data arrives, not what trains: loader workers
(each sample's augmentation is seeded by its index, not by a worker), validation's batching
and cache, and the layout of images and convolution weights (``channels_last``: the same values
in another order)."""

NOT_APPLICABLE = {
    "seed": "the random streams and the data order continue from the checkpoint",
    "model.optimizer._target_": "the checkpoint's optimizer state is of its own class",
}
"""Changes ``resume.allow_changes`` cannot apply, and why."""

_EFFECTIVE_BATCH_KEYS = (
    "hw.accumulate_grad_batches",
    "hw.target_effective_batch",
    "trainer.accumulate_grad_batches",
)

_MODEL_FLAGS = {"compile": False, "channels_last": False}
"""Model settings that change nothing in its parameters' names and shapes, set so that building it
for the shape check reads no hardware profile (``compile: ${hw.compile}`` needs one settled)."""

_ABSENT = "<absent>"
"""How a setting one of two configs lacks reads in a list of changes."""

_SHOWN_KEYS = 8
"""How many differing settings a refusal lists before it says how many more there are."""


class ResumeSettings(Settings):
    """``resume.*`` of conf/train.yaml: what a resume from ``ckpt_path`` may change."""

    allow_changes: bool = False
    """Apply changes of settings that break exactness (model, optimizer, schedule, data,
    accumulation, precision) instead of refusing them; each is printed and recorded."""
    changes: tuple[str, ...] = ()
    """Written by a resume, not set by hand: each exactness-breaking change it applied
    (``key: old -> new``)."""


class ResumeContract(Callback):
    """Hydra callback: `check_resume` before a single training run writes anything; it refuses
    and changes nothing (the run asks for the verdict again and applies it, `train()`).

    ``eval.py`` writes into a folder of its own, never a checkpoint's: ``evaluate`` checks its
    checkpoint itself, whatever Hydra settings it runs under.
    """

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        if "train" not in config:  # not train.yaml's config
            return
        with refusals_as_messages():
            check_resume(config)


@dataclasses.dataclass(frozen=True)
class ResumeVerdict:
    """What a run's checkpoint settings let it do: the exactness-breaking changes it applies
    (``resume.allow_changes=true``), each as ``key: old -> new``; () when there are none."""

    changes: tuple[str, ...] = ()

    @property
    def overrides(self) -> tuple[str, ...]:
        """The overrides that record the changes in the run's config (``resume.changes``)."""
        if not self.changes:
            return ()
        return (f"++resume.changes={override_text(list(self.changes))}",)

    @property
    def lines(self) -> tuple[str, ...]:
        """One line per change applied, for the console."""
        return tuple(f"resume: applying {c} (resume.allow_changes=true)" for c in self.changes)


def check_resume(config: DictConfig) -> ResumeVerdict:
    """Check ``ckpt_path`` and ``init_from`` of ``config`` (a run's config, Hydra's node included
    or not, left unchanged) and return the verdict: the changes a resume applies.

    Raises `ConfigError` for an unreadable checkpoint, one of another task or model shape, both
    keys at once, exactness-breaking changes without ``resume.allow_changes=true``, or, with it,
    a change it cannot apply (`NOT_APPLICABLE`). A verdict is kept for the checkpoint file and
    the config it was given: asked again (the Hydra callback, then ``train()``), it reads and
    builds nothing twice.
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
        return ResumeVerdict()
    asked = (key, _identity_or_none(Path(str(path))), OmegaConf.to_yaml(task))
    if asked not in _verdicts:
        _verdicts[asked] = _verdict(key, Path(str(path)), task, settings)
    return _verdicts[asked]


def _verdict(key: str, path: Path, task: DictConfig, settings: ResumeSettings) -> ResumeVerdict:
    checkpoint = _readable(key, path)
    contract = _contract_of(checkpoint)
    _contracts[_identity(path)] = contract
    recorded = _recorded_config(path)
    _check_same_model(key, path, checkpoint, task, recorded)
    if key != "ckpt_path" or not task.get("train", False):
        return ResumeVerdict()  # evaluation or new weights: nothing resumes
    trained = contract["settings"] if contract else _composed_settings(recorded)
    changes = exactness_changes(trained, task) if trained is not None else []
    if not changes:
        return ResumeVerdict()
    if not settings.allow_changes:
        raise ConfigError(_refusal(path, changes), tuple(k for k, _, _ in changes))
    return _applicable(path, changes)


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
    trained: dict[str, Any] | DictConfig, current: DictConfig
) -> list[tuple[str, Any, Any]]:
    """``(key, old, new)`` for each leaf under `COMPOSED_KEYS` that differs between the settings
    a checkpoint was trained with (a contract's flat ``{key: value}``, or a recorded config) and
    ``current`` (unresolved: interpolations compare as written, but for a class default, which
    compares by value, `_leaves`); a missing key reads `_ABSENT`."""
    old = _leaves(trained)
    new = _leaves(current)
    return [
        (key, old.get(key, _ABSENT), new.get(key, _ABSENT))
        for key in sorted(old.keys() | new.keys())
        if _breaks_exactness(key) and old.get(key, _ABSENT) != new.get(key, _ABSENT)
    ]


def composed_settings(cfg: DictConfig | dict[str, Any]) -> dict[str, Any]:
    """The leaves of ``cfg`` under `COMPOSED_KEYS`, unresolved but for class defaults, which are
    recorded as values (``{"model.optimizer.lr": …}``): the composed part of a checkpoint's
    contract, which then compares with one written before the schemas and still says what the
    run trained when a class default changes later."""
    return {key: value for key, value in _leaves(cfg).items() if _breaks_exactness(key)}


def _composed_settings(recorded: dict[str, Any] | None) -> dict[str, Any] | None:
    return composed_settings(recorded) if recorded is not None else None


def _breaks_exactness(key: str) -> bool:
    def under(prefixes: tuple[str, ...]) -> bool:
        return any(key == prefix or key.startswith(f"{prefix}.") for prefix in prefixes)

    return under(COMPOSED_KEYS) and not under(MAY_CHANGE)


def _leaves(cfg: DictConfig | dict[str, Any]) -> dict[str, Any]:
    """The leaves of a composed config (``DictConfig``) or of a record read as data (a dict: a
    contract's flat settings, a run folder's config), as dotted keys. Only class defaults
    (``${settings_default:…}``, `with_class_defaults`) are resolved, on both sides, so a run
    recorded with the numbers compares equal to the same run composed under the schemas; a
    record's only from vramkit's own components (`OWN_COMPONENTS`)."""
    if isinstance(cfg, dict):
        container = with_class_defaults(cfg, OWN_COMPONENTS)
    else:
        container = with_class_defaults(OmegaConf.to_container(cfg, resolve=False))
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
    # A 4-bit layer built on the meta device is the planner's stand-in, whose buffers are not the
    # run's serialized quantization state (bitsandbytes' ``weight.absmax``, ``quant_map``, ...):
    # what lies under such a layer is not compared, everything else (adapters, norms) is.
    quantized = tuple(
        f"{name}." for name, sub in model.named_modules() if isinstance(sub, PlannedQuantizedLinear)
    )
    expected = {
        name: tuple(value.shape)
        for name, value in model.state_dict().items()
        if not name.startswith(quantized)
    }
    found = {
        name: tuple(value.shape)
        for name, value in checkpoint["state_dict"].items()
        if not name.startswith(quantized)
    }
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


def _applicable(path: Path, changes: list[tuple[str, Any, Any]]) -> ResumeVerdict:
    impossible = [
        f"{key}: {old} -> {new} ({why})"
        for key, old, new in changes
        for prefix, why in NOT_APPLICABLE.items()
        if key == prefix or key.startswith(f"{prefix}.")
    ]
    if impossible:
        raise ConfigError(
            f"ckpt_path {path}: resume.allow_changes=true cannot apply "
            f"{'; '.join(impossible)}; start a new run from its weights with init_from={path}",
            ("ckpt_path",),
        )
    return ResumeVerdict(tuple(f"{key}: {old} -> {new}" for key, old, new in changes))


_contracts: dict[tuple[str, int, int], dict[str, Any] | None] = {}
"""Contracts read by `check_resume`, by checkpoint identity: ``train()`` reads them again after
settling without loading the checkpoint twice."""

_verdicts: dict[tuple[str, tuple[str, int, int] | None, str], ResumeVerdict] = {}
"""Verdicts of `check_resume`, by the key checked, the checkpoint's identity and the config."""


def _identity_or_none(path: Path) -> tuple[str, int, int] | None:
    # No file (or no readable one): nothing to keep; `_readable` refuses it with its reason.
    try:
        return _identity(path)
    except OSError:
        return None


def _identity(path: Path) -> tuple[str, int, int]:
    stat = path.stat()
    return str(path.absolute()), stat.st_mtime_ns, stat.st_size


def checkpoint_contract(path: str | Path) -> dict[str, Any] | None:
    """The contract checkpoint ``path`` carries (None: one written before contracts)."""
    path = Path(str(path))
    identity = _identity(path)
    if identity not in _contracts:
        _contracts[identity] = _contract_of(read_checkpoint(path))
    return _contracts[identity]


def _contract_of(checkpoint: dict[str, Any]) -> dict[str, Any] | None:
    # A file's contents are data: anything but the shape CheckpointContract writes reads as none.
    contract = checkpoint.get(CONTRACT_KEY)
    shaped = isinstance(contract, dict) and all(
        isinstance(contract.get(part), dict) for part in ("settings", "batch")
    )
    return contract if shaped else None


def run_contract(composed: DictConfig, profile: HardwareProfile) -> dict[str, Any]:
    """The contract of a run: its composed settings (``composed``, the user's config before
    settling) and its batch as settled (``profile``), as plain values a ``weights_only`` load
    reads back."""
    return {
        "settings": composed_settings(_task_config(composed)),
        "batch": {
            "per_device": int(profile.batch_size),
            "accumulate": int(profile.accumulate_grad_batches),
            "processes": int(profile.world_size),
            "precision": str(profile.precision),
        },
    }


def keep_trained_batch(composed: DictConfig, settlement: Settlement) -> Settlement:
    """On a resume of a checkpoint with a contract: ``settlement`` with the samples per optimizer
    step of the checkpoint's run kept. The per-device batch becomes the largest divisor of the
    checkpoint's that fits what this machine settled (the checkpoint's own when that fits), the
    accumulation makes up the rest (batch 4 × 1 → 1 × 4); a position inside an epoch then counts
    in whole new batches. Raises `ConfigError`, in one line, for another number of processes, for
    another precision without ``resume.allow_changes``, and where no batch keeps the samples per
    step. A regrouped batch says so in `Settlement.warnings`."""
    ckpt_path = composed.get("ckpt_path")
    if not ckpt_path or not composed.get("train", True):
        return settlement
    contract = checkpoint_contract(ckpt_path)
    if contract is None:
        return settlement
    trained, profile = contract["batch"], settlement.profile
    allowed = resume_settings(_task_config(composed)).allow_changes
    head = f"ckpt_path {ckpt_path}: a resume continues the run exactly, and"
    if profile.world_size != trained["processes"]:
        raise ConfigError(
            f"{head} this run has {profile.world_size} processes, the checkpoint's "
            f"{trained['processes']} (loader positions count per process); resume with "
            f"hw.devices / hw.num_nodes giving {trained['processes']}, or start a new run with "
            f"init_from={ckpt_path}",
            ("hw.devices",),
        )
    if profile.precision != trained["precision"] and not allowed:
        raise ConfigError(
            f"{head} this machine settles hw.precision {profile.precision}, the checkpoint "
            f"trained at {trained['precision']}; resume where that precision runs, or apply it "
            "with resume.allow_changes=true",
            ("hw.precision",),
        )
    user_changed = any(
        key.startswith(prefix)
        for key, _, _ in exactness_changes(contract["settings"], _task_config(composed))
        for prefix in _EFFECTIVE_BATCH_KEYS
    )
    per_step_before = trained["per_device"] * trained["accumulate"]
    per_step = (
        profile.batch_size * profile.accumulate_grad_batches if user_changed else per_step_before
    )
    fitting = [
        size
        for size in range(min(trained["per_device"], int(profile.batch_size)), 0, -1)
        if trained["per_device"] % size == 0 and per_step % size == 0
    ]
    if not fitting:
        raise ConfigError(
            f"{head} no batch of at most {profile.batch_size} samples per device (what this "
            f"machine settles) regroups the checkpoint's {trained['per_device']} into "
            f"{per_step} samples per optimizer step; resume where hw.batch_size="
            f"{trained['per_device']} fits, or start a new run with init_from={ckpt_path}",
            ("hw.batch_size",),
        )
    size = fitting[0]
    accumulate = per_step // size
    if (size, accumulate) == (profile.batch_size, profile.accumulate_grad_batches):
        return settlement
    regrouped_line = (
        f"resume: batch {size} × {accumulate} accumulated (this machine settled "
        f"{profile.batch_size} × {profile.accumulate_grad_batches}) keeps the checkpoint's "
        f"{per_step} samples per device and optimizer step (it trained "
        f"{trained['per_device']} × {trained['accumulate']})"
    )
    regrouped = {"hw.batch_size": size, "hw.accumulate_grad_batches": accumulate}
    kept = tuple(o for o in settlement.overrides if override_key(o) not in regrouped)
    return dataclasses.replace(
        settlement,
        profile=profile.model_copy(
            update={"batch_size": size, "accumulate_grad_batches": accumulate}
        ),
        overrides=(*kept, *(f"++{key}={value}" for key, value in regrouped.items())),
        warnings=(*settlement.warnings, regrouped_line),
    )
