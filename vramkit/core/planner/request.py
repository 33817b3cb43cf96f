"""The planner's one input: what to plan (module and data factories), on which hardware, how.

A `PlanRequest` holds concrete values only. "auto" batch sizes are read once, by
`batch_size_request`, into a `BatchSizeRequest` (per phase a set size, or None for "auto");
everything after it asks that value, never the profile's "auto" (a test fences the comparison
into that one function). `requested_batch_sizes` turns it into what the planner plans: an int, or
None for "search the largest that fits the budget". Requests are built from a composed Hydra config
(`vramkit.core.run.settling.plan_request_from_config`) or directly from a user's module and data
(`vramkit.plan`); the planner never reads a config (an import-linter contract in pyproject.toml
keeps omegaconf and hydra out of `vramkit.core.planner`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from vramkit.core.hardware.profile import AUTO, HardwareProfile, ProfileError, ProfileSource
from vramkit.core.planner.tracing.batches import PhaseSamples
from vramkit.core.planner.tracing.run_setup import RunSetup
from vramkit.core.planner.tracing.sharding import sharding_of
from vramkit.core.units import GIB

ModelOverrides = tuple[tuple[str, str], ...]
"""Model config keys a remedy replaces: (key under ``model``, YAML value), as
`RunSetup.model_overrides`."""

DEFAULTS_KEY = "batch_size_defaults"
"""Top-level config key of the task's stated batch sizes (``train``, ``val``)."""

BATCH_SIZE_KEYS = (("batch_size", "train"), ("val_batch_size", "val"))
"""Each phase's batch size: its `hw.` key and its `batch_size_defaults` key."""

UNBOUNDED_BATCH = 4096
"""The largest batch size searched when the dataset does not say how many samples it has."""


class ModuleFactory(Protocol):
    """Builds the task's LightningModule with `overrides` applied; the planner calls it under
    the meta device, so weights cost nothing."""

    def __call__(self, overrides: ModelOverrides) -> Any: ...


@dataclass(frozen=True)
class TaskBatchDefaults:
    """The batch sizes a task states (``batch_size_defaults``): what "auto" takes without a GPU
    budget to plan, and the effective batch kept with accumulation. None: not stated."""

    train: int | None = None
    val: int | None = None

    def for_auto(self, field: str, source: ProfileSource) -> int:
        """The stated size that `hw.<field>` ("batch_size" or "val_batch_size") set to "auto"
        takes; a `ProfileError` naming the key and its file when the task states none."""
        phase = dict(BATCH_SIZE_KEYS)[field]
        value = getattr(self, phase)
        if value is None:
            raise ProfileError(
                f"hw.{field} is 'auto' ({source.where(field)}) but the task config has no "
                f"{DEFAULTS_KEY}.{phase}: set hw.{field}=<int> or {DEFAULTS_KEY}.{phase}=<int>",
                keys=(field,),
            )
        return value


def _task_batch_default(config: Mapping[str, Any], phase: str) -> int | None:
    """The task's stated batch size for `phase` ("train" or "val"): `batch_size_defaults.<phase>`
    of the run's `config` (a composed config is a mapping).

    None when the task states none; a `ProfileError` when it states something other than a
    positive int.
    """
    defaults = config.get(DEFAULTS_KEY)
    value = defaults.get(phase) if isinstance(defaults, Mapping) else None
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
        raise ProfileError(
            f"{DEFAULTS_KEY}.{phase} must be a positive int, got {value!r}", keys=(phase,)
        )
    return value


def task_batch_defaults(config: Mapping[str, Any]) -> TaskBatchDefaults:
    """The batch sizes the run's `config` states (`batch_size_defaults`)."""
    return TaskBatchDefaults(*(_task_batch_default(config, phase) for _, phase in BATCH_SIZE_KEYS))


def setup_for(
    profile: HardwareProfile,
    trainer: Mapping[str, Any] | None,
    world_size: int,
    *,
    activation_offload: bool = False,
) -> RunSetup:
    """The `RunSetup` a run asks for on `profile`: the profile's precision and accumulation, the
    `trainer` config's strategy on `world_size` processes (`sharding_of`), activation offload."""
    return RunSetup.from_profile(profile).replace(
        activation_offload=activation_offload, sharding=sharding_of(trainer, world_size)
    )


@dataclass(frozen=True)
class ModelFacts:
    """What the remedies need to know about how the module is configured."""

    optimizer: str = "configure_optimizers()"
    """The configured optimizer's class name (e.g. "AdamW8bit"), or how the module makes it."""
    adam: bool = False
    """The optimizer the planner builds is torch's Adam or AdamW (8-bit AdamW can replace it)."""
    bitsandbytes_optimizer: str | None = None
    """The layout of the bitsandbytes optimizer the config names (planned as torch's AdamW with
    that layout), None for any other optimizer."""
    gradient_checkpointing: bool | None = None
    """The model's ``gradient_checkpointing`` setting; None when it has none (checkpointing is
    then a change of the user's code)."""
    lora_defaults: Mapping[str, Any] | None = None
    """The settings of ``conf/model/lora/default.yaml`` when the model takes adapters from a
    ``lora`` key left null; None when LoRA is not a remedy for it."""
    activation_offload_available: bool = False
    """The run has the ``callbacks.activation_offload`` callback (it can be enabled)."""


@dataclass(frozen=True)
class PlanRequest:
    """Everything the planner plans from; nothing else is read."""

    module: ModuleFactory
    data: Callable[[], PhaseSamples]
    """One sample batch per phase (called once, before the first trace)."""
    profile: HardwareProfile
    """The target hardware: its facts (capability, kernels) and its memory budget."""
    setup: RunSetup
    """Precision, strategy and world size, activation offload, accumulation: the run as asked."""
    train_batch_size: int | None
    """The training batch to plan; None searches the largest that fits the budget."""
    val_batch_size: int | None
    """The validation (and inference) batch to plan; None searches."""
    with_remedies: bool = True
    """Propose remedies when the run does not fit."""
    model: ModelFacts = field(default_factory=ModelFacts)
    max_epochs: int = 1
    max_steps: int = -1
    """The trainer's length, for `configure_optimizers` schedules (-1: not set)."""
    task_batch_defaults: TaskBatchDefaults = field(default_factory=TaskBatchDefaults)
    largest_searched: int = UNBOUNDED_BATCH
    """The upper bound of a batch-size search when the dataset's length is unknown."""

    @property
    def budget_bytes(self) -> int | None:
        """The profile's memory budget (bytes); None for a profile without one (CPU)."""
        budget = self.profile.budget_gib
        return None if budget is None else int(budget * GIB)


@dataclass(frozen=True)
class BatchSizeRequest:
    """The batch sizes a profile asks for, "auto" read: per phase the size set, or None where
    "auto" leaves the size to be chosen (searched within a memory budget, else the task's
    stated default)."""

    train: int | None
    """Training samples per step and device; None: "auto"."""
    val: int | None
    """Validation (and inference) samples per step and device; None: "auto"."""

    @property
    def sizes(self) -> tuple[int | None, int | None]:
        """(train, val), each None where "auto"."""
        return self.train, self.val

    @property
    def searched(self) -> tuple[bool, bool]:
        """(train, val): whether the phase's size is "auto", to be chosen."""
        return self.train is None, self.val is None

    @property
    def any_searched(self) -> bool:
        """Whether a phase's size is "auto"."""
        return self.train is None or self.val is None


def batch_size_request(
    profile: HardwareProfile, *, train: int | str | None = None, val: int | str | None = None
) -> BatchSizeRequest:
    """The one place "auto" is read: what `profile`'s ``batch_size`` / ``val_batch_size`` ask
    for (replaced by `train` / `val` when given), each phase an int, or None for "auto"."""
    sizes = []
    for key, given in (("batch_size", train), ("val_batch_size", val)):
        value = getattr(profile, key) if given is None else given
        sizes.append(None if value == AUTO else int(value))
    return BatchSizeRequest(sizes[0], sizes[1])


def requested_batch_sizes(
    profile: HardwareProfile,
    defaults: TaskBatchDefaults = TaskBatchDefaults(),
    *,
    train: int | str | None = None,
    val: int | str | None = None,
) -> tuple[int | None, int | None]:
    """The batch sizes the planner plans for `profile`: (train, val), "auto" read by
    `batch_size_request`.

    `train` / `val` replace the profile's ``batch_size`` / ``val_batch_size`` when given. An int
    is kept. "auto" is None (searched: the largest that fits) on a profile with a memory
    budget, and the task's stated default on one without; a `ProfileError` names the key when
    there is neither a budget nor a default.
    """
    asked = batch_size_request(profile, train=train, val=val)
    chosen = []
    for key, size, default in (
        ("batch_size", asked.train, defaults.train),
        ("val_batch_size", asked.val, defaults.val),
    ):
        if size is not None:
            chosen.append(size)
        elif profile.budget_gib is not None:
            chosen.append(None)
        elif default is not None:
            chosen.append(default)
        else:
            phase = "train" if key == "batch_size" else "val"
            raise ProfileError(
                f"profile {profile.name} has no memory budget to search batch sizes and the "
                f"task states no {DEFAULTS_KEY}.{phase}; give {key}",
                keys=(key,),
            )
    return chosen[0], chosen[1]
