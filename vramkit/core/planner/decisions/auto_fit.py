"""Fit a run that does not fit: the cheapest combination of remedies whose traced plan fits.

`hw.fit: auto` (the default of GPU profiles) calls `choose_fit` when the plan of the requested run
is over the budget. Remedies are ranked by what they cost the user (`COST_ORDER`); a combination
costs what its most expensive member costs, then its next most expensive one, and so on (so
checkpointing with 8-bit AdamW comes before bf16-true alone, which comes before LoRA). The search
traces the combinations in that order, each with a smaller micro-batch and accumulation right
after it when its training step is what does not fit, and stops at the first one that fits and
may be applied. One that fits but needs a consent the profile did not give (`hw.fit_allow`, e.g.
LoRA, which changes what is trained) or a package that is not installed is traced, reported
("would fit with hw.fit_allow=[lora]", "would fit after pip install bitsandbytes") and passed over.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import itertools
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from vramkit.core.hardware.profile import HardwareProfile
from vramkit.core.planner.cuda.optimizer_layouts import ADAMW_8BIT
from vramkit.core.planner.decisions.plan import VAL, MemoryPlanner, PhasePlan
from vramkit.core.planner.decisions.remedies import (
    Change,
    candidate_changes,
    combined,
    micro_batch_plan,
)
from vramkit.core.planner.errors import PlanningError
from vramkit.core.planner.tracing.run_setup import RunSetup
from vramkit.core.tables import render_table
from vramkit.core.units import GIB

COST_ORDER: tuple[str, ...] = (
    "micro-batch with accumulation",  # the same effective batch and result; more, smaller steps
    "gradient checkpointing",  # the same result; each block's forward runs twice
    "8-bit optimizer",  # optimizer state quantised to 8 bits; trains the same weights
    "bf16-true",  # weights and optimizer state in bf16: coarser updates
    "LoRA",  # trains adapters instead of the weights: only with hw.fit_allow=[lora]
    "sharding across GPUs",  # ZeRO: needs more GPUs and DeepSpeed
    "offload to CPU",  # state or activations over PCIe: the slowest
)
"""The remedies from cheapest to dearest, as the automatic fit tries them."""

MICRO_BATCH, CHECKPOINTING, EIGHT_BIT, PRECISION, LORA, SHARDING, OFFLOAD = range(len(COST_ORDER))

MAX_COMBINED = 3
"""Most setup changes combined in one candidate (a micro-batch comes on top)."""

# The module each kind of override needs, and the command that installs it when none is stated.
_PACKAGES = (
    ("bitsandbytes", "bitsandbytes"),
    ("lora.quantize=", "bitsandbytes"),  # QLoRA's 4-bit or 8-bit base layers
    ("deepspeed", "deepspeed"),
    ("lora", "peft"),
)


def cost_rank(change: Change) -> int:
    """`change`'s place in `COST_ORDER`; a change of an unknown kind ranks just before offload."""
    name = change.name.lower()
    if "offload" in name:
        return OFFLOAD
    if change.needs_consent:
        return LORA
    if "zero" in name or "deepspeed" in name:
        return SHARDING
    if change.changes.get("gradient_checkpointing"):
        return CHECKPOINTING
    if change.changes.get("optimizer") == ADAMW_8BIT:
        return EIGHT_BIT
    if set(change.changes) == {"precision"}:
        return PRECISION
    return SHARDING


def missing_packages(change: Change, importable: Callable[[str], bool]) -> list[str]:
    """How to install what `change` needs and this environment lacks ("pip install …")."""
    text = " ".join(change.overrides).lower()
    needs = [module for marker, module in _PACKAGES if marker in text]
    if change.needs_consent == "lora" and "peft" not in needs:
        needs.append("peft")
    stated = re.findall(r"pip install [^;()]+", change.note)
    commands = []
    for module in needs:
        if importable(module):
            continue
        command = next((c.strip() for c in stated if module in c), f"pip install {module}")
        commands.append(command)
    return commands


def importable(module: str) -> bool:
    """Whether `module` is installed here (without importing it): found on the path, or its
    distribution's metadata is, for a library a plan process keeps from loading
    (`vramkit.unloaded_libraries`: ``find_spec`` answers None for it there)."""
    if importlib.util.find_spec(module) is not None:
        return True
    try:
        importlib.metadata.distribution(module)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


@dataclass(frozen=True)
class FitCandidate:
    """One combination of remedies, traced: its peaks and whether the run may take it."""

    name: str
    overrides: tuple[str, ...]
    """The command-line overrides that ask for it, as typed after the original command."""
    cost: tuple[int, ...]
    """`COST_ORDER` ranks of its members, dearest first (compared as a tuple)."""
    train: PhasePlan
    val: PhasePlan
    fits: bool
    """Both phases stay within the budget."""
    blocked: str = ""
    """Why it may not be applied although it would fit ("" when nothing stops it)."""

    @property
    def usable(self) -> bool:
        """It fits and nothing stops the run from taking it."""
        return self.fits and not self.blocked

    def verdict(self) -> str:
        """ "fits", "no", or "fits, but …" for the table."""
        if not self.fits:
            return "no"
        return f"would fit {self.blocked}" if self.blocked else "fits"

    def as_json(self) -> dict[str, Any]:
        """Name, overrides, cost ranks, peaks (GiB), fits, blocked."""
        return {
            "name": self.name,
            "overrides": list(self.overrides),
            "cost": [COST_ORDER[rank] for rank in self.cost],
            "train": phase_json(self.train),
            "val": phase_json(self.val),
            "fits": self.fits,
            "blocked": self.blocked or None,
        }


def phase_json(phase: PhasePlan) -> dict[str, Any]:
    """A phase plan's batch, accumulation and peak (GiB) for `fit_decision.json`."""
    return {
        "batch_size": phase.batch_size,
        "accumulate_grad_batches": phase.accumulate_grad_batches,
        "peak_gib": round(phase.peak_gib, 3),
        "at_least": phase.at_least,
    }


@dataclass(frozen=True)
class FitDecision:
    """What the automatic fit considered for a run over budget, and what it chose."""

    profile: HardwareProfile
    budget_bytes: int
    requested: tuple[PhasePlan, PhasePlan]
    """The requested run's training and validation plans."""
    auto_batch: bool
    """The training batch size is "auto": candidates are traced at batch 1 and the run then
    searches the largest batch that fits under the chosen remedy."""
    candidates: tuple[FitCandidate, ...]
    """Every candidate traced, in the order of the search."""
    chosen: FitCandidate | None

    def table(self) -> str:
        """The candidates with their traced peaks (GiB; "≥" a bound), the requested run first."""
        train, val = self.requested
        rows = [["requested run", f"{train.peak_gib:.3f}", f"{val.peak_gib:.3f}", "no", ""]]
        for candidate in self.candidates:
            mark = " <- chosen" if candidate is self.chosen else ""
            rows.append(
                [
                    candidate.name,
                    candidate.train.peak_text(3),
                    candidate.val.peak_text(3),
                    candidate.verdict() + mark,
                    " ".join(candidate.overrides),
                ]
            )
        header = (
            f"the requested run does not fit {self.profile.label} ({self.profile.name}): budget "
            f"{self.budget_bytes / GIB:.2f} GiB; remedies tried from cheapest to dearest "
            f"({', '.join(COST_ORDER)})"
        )
        if self.auto_batch:
            header += "; batch size 'auto': each traced at batch 1"
        columns = ["candidate", "train GiB", "val GiB", "verdict", "overrides"]
        body = render_table(columns, rows, left=("verdict", "overrides"), width=180)
        return f"{header}\n{body}"

    def best(self, count: int = 3) -> list[FitCandidate]:
        """The candidates with the lowest larger peak of the two phases."""
        return sorted(self.candidates, key=lambda c: max(c.train.peak, c.val.peak))[:count]

    def refusal(self) -> str:
        """Why nothing was applied: no candidate fits, or none that fits may be applied."""
        lines = [
            f"no combination of remedies that may be applied fits {self.profile.label}'s budget "
            f"of {self.budget_bytes / GIB:.2f} GiB; the closest (train / val GiB):"
        ]
        for candidate in self.best():
            lines.append(
                f"  {candidate.name}: {candidate.train.peak_text()} / "
                f"{candidate.val.peak_text()} ({candidate.verdict()}) "
                f"{' '.join(candidate.overrides)}"
            )
        blocked = [c for c in self.candidates if c.fits and c.blocked]
        for candidate in blocked:
            lines.append(f"  {candidate.name} {candidate.verdict()}")
        return "\n".join(lines)

    def as_json(self) -> dict[str, Any]:
        """The decision as plain JSON values, for `fit_decision.json`."""
        train, val = self.requested
        return {
            "profile": self.profile.name,
            "device": self.profile.label,
            "budget_gib": round(self.budget_bytes / GIB, 3),
            "fit": self.profile.fit,
            "fit_allow": list(self.profile.fit_allow),
            "cost_order": list(COST_ORDER),
            "requested": {"train": phase_json(train), "val": phase_json(val)},
            "auto_batch": self.auto_batch,
            "candidates": [candidate.as_json() for candidate in self.candidates],
            "chosen": None if self.chosen is None else self.chosen.name,
            "overrides": [] if self.chosen is None else list(self.chosen.overrides),
        }


@dataclass(frozen=True)
class _Option:
    changes: tuple[Change, ...]
    micro_batch: bool

    @property
    def cost(self) -> tuple[int, ...]:
        ranks = [cost_rank(change) for change in self.changes]
        if self.micro_batch:
            ranks.append(MICRO_BATCH)
        return tuple(sorted(ranks, reverse=True))


def _merged(changes: Sequence[Change]) -> Change | None:
    merged: Change | None = changes[0]
    for change in changes[1:]:
        merged = combined(merged, change) if merged is not None else None
    return merged


def _options(changes: Sequence[Change], micro_batch: bool) -> list[_Option]:
    """Every compatible combination, with and without a micro-batch, cheapest first."""
    options = [_Option((), True)] if micro_batch else []
    for size in range(1, MAX_COMBINED + 1):
        for group in itertools.combinations(changes, size):
            if _merged(group) is None:
                continue  # two members decide the same thing (the optimizer, the precision)
            options.append(_Option(group, False))
            if micro_batch:
                options.append(_Option(group, True))
    return sorted(options, key=lambda option: (option.cost, len(option.changes)))


def choose_fit(
    planner: MemoryPlanner,
    profile: HardwareProfile,
    setup: RunSetup,
    requested: tuple[PhasePlan, PhasePlan],
    *,
    train_batch_size: int | None,
    val_batch_size: int | None,
    budget_bytes: int,
    typed: Callable[[str], str] = str,
    can_import: Callable[[str], bool] = importable,
    changes: Sequence[Change] | None = None,
) -> FitDecision:
    """The cheapest combination of remedies that fits `budget_bytes` and may be applied.

    `train_batch_size` / `val_batch_size` are the requested sizes, None for "auto" (traced at 1:
    the run searches the largest under the chosen remedy). `typed` turns an override into the
    form the user appends ("+hw.batch_size=4" when no `+hw=` profile was given). `changes`
    defaults to the planner's `candidate_changes`. `decision.chosen` is None when nothing that
    may be applied fits.
    """
    if changes is None:
        changes = candidate_changes(profile, setup, planner)
    can_micro = train_batch_size is not None and train_batch_size > 1
    candidates: list[FitCandidate] = []
    dead_ends: list[frozenset[int]] = []  # fitting but blocked: their supersets are too
    options = _options(changes, can_micro)
    val_over = requested[1].peak > budget_bytes and (val_batch_size or 1) > 1
    if val_over:
        options.insert(0, _Option((), False))  # a smaller validation batch alone
    for option in options:
        members = frozenset(id(change) for change in option.changes)
        if any(dead <= members for dead in dead_ends):
            continue
        if option.micro_batch and not _needs_micro_batch(
            candidates, option, requested[0], budget_bytes
        ):
            continue
        candidate = _evaluate(
            planner,
            option,
            setup,
            train_batch_size,
            val_batch_size,
            budget_bytes,
            typed,
            _blocked(option, profile, can_import),
        )
        if candidate is None:
            continue
        candidates.append(candidate)
        if candidate.usable:
            return FitDecision(
                profile, budget_bytes, requested, train_batch_size is None, tuple(candidates),
                candidate,
            )  # fmt: skip
        if candidate.fits and option.changes:
            dead_ends.append(members)
    return FitDecision(
        profile, budget_bytes, requested, train_batch_size is None, tuple(candidates), None
    )


def _needs_micro_batch(
    candidates: list[FitCandidate], option: _Option, requested_train: PhasePlan, budget: int
) -> bool:
    """A micro-batch is tried only where the same changes without one left training over."""
    if not option.changes:
        return requested_train.peak > budget
    name = _option_name(_Option(option.changes, False))
    plain = next((c for c in candidates if c.name == name), None)
    return plain is not None and plain.train.peak > budget


def _blocked(option: _Option, profile: HardwareProfile, can_import: Callable[[str], bool]) -> str:
    reasons: list[str] = []
    for change in option.changes:
        consent = change.needs_consent
        for entry in filter(None, consent.split(",")):
            if entry not in profile.fit_allow:
                reasons.append(
                    f"with hw.fit_allow=[{entry}] ({change.name} changes what is trained)"
                )
        reasons.extend(f"after {command}" for command in missing_packages(change, can_import))
    return "; ".join(dict.fromkeys(reasons))


def _option_name(option: _Option) -> str:
    names = [change.name for change in option.changes]
    if option.micro_batch:
        names.append("micro-batch")
    return " + ".join(names) or "smaller validation batch"


def _evaluate(
    planner: MemoryPlanner,
    option: _Option,
    setup: RunSetup,
    train_batch_size: int | None,
    val_batch_size: int | None,
    budget: int,
    typed: Callable[[str], str],
    blocked: str,
) -> FitCandidate | None:
    changed = setup
    overrides: list[str] = []
    for change in option.changes:
        changed = change.apply(changed)
        overrides.extend(change.overrides)
    name = _option_name(option)
    try:
        if option.micro_batch:
            assert train_batch_size is not None
            found = micro_batch_plan(planner, changed, train_batch_size, budget)
            if found is None:
                return None
            train, micro_overrides = found
            name = name.replace("micro-batch", f"micro-batch {train.batch_size} × "
                                f"accumulate {train.accumulate_grad_batches}")  # fmt: skip
            overrides.extend(micro_overrides)
        else:
            train = planner.training_verdict(train_batch_size or 1, changed, budget)
        val, val_overrides = _validation(planner, changed, val_batch_size, budget)
    except PlanningError:
        return None  # the change does not apply to this model (e.g. no blocks to checkpoint)
    overrides.extend(val_overrides)
    fits = train.peak <= budget and val.peak <= budget
    return FitCandidate(
        name, tuple(typed(o) for o in overrides), option.cost, train, val, fits, blocked
    )


def _validation(
    planner: MemoryPlanner, setup: RunSetup, requested: int | None, budget: int
) -> tuple[PhasePlan, list[str]]:
    """Validation at the requested size (1 for "auto"), else the largest size that fits."""
    val = planner.measure(VAL, requested or 1, setup)
    if requested is None or val.peak <= budget or requested < 2:
        return val, []
    size, smaller = planner.largest_batch_size(VAL, setup, budget, requested - 1)
    if size == 0:
        return val, []
    return smaller, [f"hw.val_batch_size={size}"]
