"""When a run does not fit: what would, each with its predicted peak from a new trace.

Every remedy is a change of the `RunSetup` (or of the micro-batch) that the planner traces
again, both phases, at the requested batch sizes: nothing here is a rule of thumb. Single changes
come first; unless two of them fit, pairs of them are planned as well. One trace is left out
where its verdict is certain without it: a change of only what the forward saves for backward
(gradient checkpointing, activation offload) cannot lower a peak that lies in the optimizer step,
so when the bound from the trace without it (`MemoryPlanner.training_floor`) is over the budget,
that bound is the remedy's training figure ("≥" in the plan).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from vramkit.core.hardware.profile import HardwareProfile
from vramkit.core.planner.cuda.optimizer_layouts import ADAMW_8BIT, ZERO2_OFFLOAD
from vramkit.core.planner.decisions.plan import TRAIN, VAL, MemoryPlanner, PhasePlan
from vramkit.core.planner.errors import PlanningError
from vramkit.core.planner.tracing.run_setup import RunSetup
from vramkit.core.planner.tracing.sharding import ZERO2 as ZERO2_STRATEGY
from vramkit.core.planner.tracing.sharding import ZERO2_OFFLOAD as ZERO2_OFFLOAD_STRATEGY
from vramkit.core.planner.tracing.sharding import ZERO3 as ZERO3_STRATEGY
from vramkit.core.planner.tracing.sharding import Sharding


@dataclass(frozen=True)
class Remedy:
    """One way to make the run fit, and what the planner predicts for it."""

    name: str
    """What changes, e.g. "gradient checkpointing + bf16-true"."""
    overrides: tuple[str, ...]
    """Command-line overrides that ask for it: appended to the planned command, the run composes
    and starts as planned (tests/core/planner/decisions/test_remedy_lines.py)."""
    note: str
    """What else it needs (a package, a code change), or what it keeps; "" when nothing."""
    train: PhasePlan
    val: PhasePlan
    fits: bool
    """Both phases stay within the budget."""
    needs_consent: str = ""
    """The `hw.fit_allow` entry a user must give before this remedy is applied for them ("lora"
    when it changes what is trained); "" when it trains the same weights."""

    @property
    def how(self) -> str:
        """The overrides, then the note in parentheses."""
        text = " ".join(self.overrides)
        if self.note:
            text = f"{text} ({self.note})" if text else self.note
        return text


@dataclass(frozen=True)
class Change:
    """A change of the run the planner can try: its overrides and what it changes in the setup."""

    name: str
    overrides: tuple[str, ...]
    """Command-line overrides that ask for it."""
    note: str
    """What else it needs (a package, a code change); "" when nothing."""
    changes: dict
    """`RunSetup` fields it changes."""
    needs_consent: str = ""
    """The `hw.fit_allow` entry it needs ("" when it trains the same weights)."""

    def apply(self, setup: RunSetup) -> RunSetup:
        """`setup` with this change."""
        return setup.replace(**self.changes)


def candidate_changes(
    profile: HardwareProfile, setup: RunSetup, planner: MemoryPlanner
) -> list[Change]:
    """The setup changes worth planning for this model and profile (none it already has), from
    what the request says of the model (`planner.model`)."""
    model = planner.model
    changes = []
    if model.gradient_checkpointing is not True:
        configurable = model.gradient_checkpointing is not None
        by_hand = "wrap the model's repeated blocks in torch.utils.checkpoint"
        changes.append(
            Change(
                "gradient checkpointing",
                ("model.gradient_checkpointing=true",) if configurable else (),
                "" if configurable else by_hand,
                {"gradient_checkpointing": True},
            )
        )
    if model.adam and not planner.bitsandbytes_optimizer:
        changes.append(
            Change(
                "8-bit AdamW",
                ("model.optimizer._target_=bitsandbytes.optim.AdamW8bit",),
                "pip install 'vramkit[bnb]'",
                {"optimizer": ADAMW_8BIT},
            )
        )
    if profile.bf16 and setup.precision != "bf16-true":
        changes.append(
            Change(
                "bf16-true",
                ("hw.precision=bf16-true",),
                "bf16 weights and optimizer state",
                {"precision": "bf16-true"},
            )
        )
    changes.extend(lora_changes(model.lora_defaults))
    offload_key = "callbacks.activation_offload"
    if not setup.activation_offload and model.activation_offload_available:
        changes.append(
            Change(
                "CPU activation offload",
                (f"{offload_key}.enabled=true",),
                "saved activations in host memory; slower steps",
                {"activation_offload": True},
            )
        )
    weights = "bf16-true" if profile.bf16 else "16-true"
    changes.extend(_deepspeed_changes(setup, weights))
    return changes


def _deepspeed_changes(setup: RunSetup, weights: str) -> list[Change]:
    """ZeRO-2 with CPU offload, and ZeRO-2 across the run's GPUs when it has several.

    Across several GPUs both are planned per device (`sharding`); on one GPU the offload is
    traced with DeepSpeed's own optimizer layout (`ZeroStage2Layout`).
    """
    current = setup.sharding
    world = current.world_size
    offload_how = ("trainer=deepspeed_zero2_offload", f"hw.precision={weights}")
    install = "pip install 'vramkit[deepspeed]'"
    changes = []
    if current.strategy != ZERO2_OFFLOAD_STRATEGY:
        if world > 1:
            offload = {"sharding": Sharding(ZERO2_OFFLOAD_STRATEGY, world), "precision": weights}
        else:
            offload = {"optimizer": ZERO2_OFFLOAD, "precision": weights}
        changes.append(Change("DeepSpeed ZeRO-2, CPU offload", offload_how, install, offload))
    if world > 1 and current.strategy not in (ZERO2_STRATEGY, ZERO3_STRATEGY):
        changes.append(
            Change(
                f"DeepSpeed ZeRO-2 across {world} GPUs",
                ("trainer=deepspeed_zero2", f"hw.precision={weights}"),
                install,
                {"sharding": Sharding(ZERO2_STRATEGY, world), "precision": weights},
            )
        )
    return changes


def lora_changes(defaults: Mapping[str, Any] | None) -> list[Change]:
    """LoRA and QLoRA with the settings `defaults` (``conf/model/lora/default.yaml``) for a
    model whose config has a ``lora`` key left null (`ModelFacts.lora_defaults`); none when
    `defaults` is None.

    Both change what is trained (adapters and head instead of every weight): they need the
    user's consent (``needs_consent="lora"``).
    """
    if defaults is None:
        return []
    defaults = dict(defaults)
    rank = defaults.get("r")
    qlora = {**defaults, "quantize": "4bit"}
    return [
        Change(
            f"LoRA r={rank}",
            ("+model/lora=default",),
            "trains adapters and the head only",
            {"model_overrides": (("lora", yaml.safe_dump(defaults)),)},
            needs_consent="lora",
        ),
        Change(
            f"QLoRA r={rank}, 4-bit base",
            ("+model/lora=default", "model.lora.quantize=4bit"),
            "trains adapters and the head only; pip install 'vramkit[bnb]'",
            {"model_overrides": (("lora", yaml.safe_dump(qlora)),)},
            needs_consent="lora",
        ),
    ]


def combined(first: Change, second: Change) -> Change | None:
    overlap = set(first.changes) & set(second.changes)
    if overlap:
        return None  # both decide the optimizer or the precision
    if {"optimizer", "sharding"} <= set(first.changes) | set(second.changes):
        return None  # DeepSpeed's ZeRO runs its own optimizer: a layout would be counted twice
    notes = "; ".join(note for note in (first.note, second.note) if note)
    consent = ",".join(entry for entry in (first.needs_consent, second.needs_consent) if entry)
    return Change(
        f"{first.name} + {second.name}",
        first.overrides + second.overrides,
        notes,
        {**first.changes, **second.changes},
        consent,
    )


def split_batch(total: int, largest: int) -> tuple[int, int]:
    """Micro-batch and accumulation for an effective batch of `total` with micro-batches of at
    most `largest`: the exact split with the fewest micro-batches when one exists within twice
    the minimum accumulation, else the near-even split (its product may exceed `total` a bit)."""
    if largest < 1:
        raise ValueError(f"largest micro-batch must be >= 1, got {largest}")
    fewest = math.ceil(total / largest)
    for accumulate in range(fewest, 2 * fewest + 1):
        if total % accumulate == 0:
            return total // accumulate, accumulate
    return math.ceil(total / fewest), fewest


def _validation_under(
    planner: MemoryPlanner, setup: RunSetup, requested: int, budget_bytes: int
) -> tuple[PhasePlan, tuple[str, ...]]:
    """Validation at the requested batch size, or the largest that fits under `setup` (with the
    override that asks for it)."""
    val = planner.measure(VAL, requested, setup)
    if val.peak <= budget_bytes or requested < 2:
        return val, ()
    size, smaller = planner.largest_batch_size(VAL, setup, budget_bytes, requested - 1)
    if size == 0:
        return val, ()
    return smaller, (f"hw.val_batch_size={size}",)


def _plan_change(
    planner: MemoryPlanner,
    change: Change,
    setup: RunSetup,
    train_batch_size: int,
    val_batch_size: int,
    budget_bytes: int,
) -> Remedy | None:
    changed = change.apply(setup)
    try:
        train = planner.training_verdict(train_batch_size, changed, budget_bytes)
        val, val_override = _validation_under(planner, changed, val_batch_size, budget_bytes)
    except PlanningError:
        return None  # the change does not apply to this model (e.g. no blocks to checkpoint)
    fits = train.peak <= budget_bytes and val.peak <= budget_bytes
    return Remedy(
        change.name,
        change.overrides + val_override,
        change.note,
        train,
        val,
        fits,
        change.needs_consent,
    )


def micro_batch_plan(
    planner: MemoryPlanner, setup: RunSetup, train_batch_size: int, budget_bytes: int
) -> tuple[PhasePlan, tuple[str, ...]] | None:
    """The training plan with the largest micro-batch under ``budget_bytes`` that keeps the
    effective batch (micro-batch × accumulation), and the overrides that ask for it; None when
    not even one sample fits."""
    accumulating = setup.replace(accumulate_grad_batches=max(2, setup.accumulate_grad_batches))
    largest, _ = planner.largest_batch_size(TRAIN, accumulating, budget_bytes, train_batch_size - 1)
    if largest == 0:
        return None
    effective = train_batch_size * setup.accumulate_grad_batches
    micro, accumulate = split_batch(effective, largest)
    train = planner.measure(TRAIN, micro, setup.replace(accumulate_grad_batches=accumulate))
    return train, (f"hw.batch_size={micro}", f"hw.accumulate_grad_batches={accumulate}")


def _micro_batch_remedy(
    planner: MemoryPlanner,
    setup: RunSetup,
    train_batch_size: int,
    val_batch_size: int,
    budget_bytes: int,
) -> Remedy | None:
    if train_batch_size < 2:
        return None
    found = micro_batch_plan(planner, setup, train_batch_size, budget_bytes)
    if found is None:
        return None
    train, overrides = found
    micro, accumulate = train.batch_size, train.accumulate_grad_batches
    val, val_override = _validation_under(planner, setup, val_batch_size, budget_bytes)
    return Remedy(
        f"micro-batch {micro} × accumulate {accumulate}",
        (*overrides, *val_override),
        f"effective batch {micro * accumulate}",
        train,
        val,
        train.peak <= budget_bytes and val.peak <= budget_bytes,
    )


def propose_remedies(
    planner: MemoryPlanner,
    profile: HardwareProfile,
    setup: RunSetup,
    train: PhasePlan,
    val: PhasePlan,
    budget_bytes: int,
) -> list[Remedy]:
    """Remedies for a plan whose `train` or `val` phase exceeds `budget_bytes`.

    When only validation is over, the remedy is the largest validation batch that fits (the
    same metrics). Otherwise, cheapest first: a smaller micro-batch with accumulation (the same
    effective batch), then each change of setup on its own, then, unless two of those fit, each
    compatible pair. Every remedy also says the validation batch to use when the requested one
    does not fit under it.
    """
    remedies: list[Remedy] = []
    if train.peak <= budget_bytes:
        val_only, val_override = _validation_under(planner, setup, val.batch_size, budget_bytes)
        if val_override:
            remedies.append(
                Remedy(
                    f"validation batch {val_only.batch_size}",
                    val_override,
                    "the same metrics",
                    train,
                    val_only,
                    val_only.peak <= budget_bytes,
                )
            )
        return remedies
    found = _micro_batch_remedy(planner, setup, train.batch_size, val.batch_size, budget_bytes)
    if found is not None:
        remedies.append(found)
    changes = candidate_changes(profile, setup, planner)
    remedies.extend(
        _evaluated(planner, changes, setup, train.batch_size, val.batch_size, budget_bytes)
    )
    if sum(remedy.fits for remedy in remedies) < 2:
        pairs = [
            pair
            for i, first in enumerate(changes)
            for second in changes[i + 1 :]
            if (pair := combined(first, second)) is not None
        ]
        remedies.extend(
            _evaluated(planner, pairs, setup, train.batch_size, val.batch_size, budget_bytes)
        )
    return remedies


def _evaluated(
    planner: MemoryPlanner,
    changes: Iterable[Change],
    setup: RunSetup,
    train_batch_size: int,
    val_batch_size: int,
    budget_bytes: int,
) -> list[Remedy]:
    found = []
    for change in changes:
        remedy = _plan_change(
            planner, change, setup, train_batch_size, val_batch_size, budget_bytes
        )
        if remedy is not None:
            found.append(remedy)
    return found
