"""Plan the requested run on its GPU profile and, when it does not fit, fit it or refuse.

`resolve_hardware` calls `fit_to_budget` once the profile is checked against the device. With
`hw.fit: auto` a run over budget takes the cheapest remedy that fits
(`vramkit.core.planner.auto_fit`): the table of what was traced is printed, the chosen overrides
are applied to the composed config before anything is built, and the decision is kept for the run
folder (`fit_decision.json`). With `hw.fit: off` the run is refused with the remedies listed. A GPU
profile rehearsed on a CPU (`hw.strict=false`) says what it would do on its GPU and runs without it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from vramkit.core.hardware.profile import AUTO, HardwareProfile
from vramkit.core.io.checkpoint_io import atomic_write_bytes
from vramkit.core.planner.auto_fit import FitDecision, choose_fit
from vramkit.core.planner.errors import DoesNotFitError
from vramkit.core.planner.remedies import propose_remedies
from vramkit.core.planner.task_plan import MemoryPlan, plan_task
from vramkit.core.run.append_overrides import append_overrides
from vramkit.core.units import GIB

FIT_DECISION = "fit_decision.json"
"""What the automatic fit decided, written into the run folder when the plan did not fit."""

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FitOutcome:
    """What planning the requested run found and did."""

    plan: MemoryPlan
    """The requested run's plan (before any remedy)."""
    decision: FitDecision | None
    """The automatic fit's candidates and choice; None when the run fits."""
    applied: bool
    """The chosen overrides were applied to the config (not on a CPU rehearsal)."""

    def record(self) -> dict[str, Any] | None:
        """The contents of `fit_decision.json`; None when the run fits."""
        if self.decision is None:
            return None
        planner = self.plan.planner
        return {**self.decision.as_json(), "applied": self.applied, "traces": planner.traces}


def fit_to_budget(
    cfg: DictConfig,
    profile: HardwareProfile,
    *,
    rehearsal: bool,
    conf_dir: Path,
    typed: Callable[[str], str] = str,
    echo: Callable[[str], None] = log.info,
) -> FitOutcome:
    """Plan `cfg` on the GPU `profile`; fit it (`hw.fit: auto`) or refuse (`off`) when over.

    `rehearsal`: the run goes on a CPU (`hw.strict=false`), so "auto" batch sizes are traced at
    1, nothing is applied and nothing is refused: the lines say what the GPU run would do.
    `typed` writes an override as the user appends it. Raises `DoesNotFitError` (not on a
    rehearsal) when the run must be refused, and `PlanningError` when it cannot be planned.
    """
    train_request = profile.batch_size if profile.batch_size != AUTO else None
    val_request = profile.val_batch_size if profile.val_batch_size != AUTO else None
    plan = plan_task(
        cfg,
        profile,
        train_batch_size=train_request or (1 if rehearsal else None),
        val_batch_size=val_request or (1 if rehearsal else None),
        with_remedies=False,
    )
    if plan.fits:
        if rehearsal:
            echo(
                f"on {profile.label} the run fits: train {plan.train.peak_gib:.2f} / val "
                f"{plan.val.peak_gib:.2f} GiB of {plan.budget_gib:.2f} GiB"
            )
        return FitOutcome(plan, None, applied=False)
    if profile.fit == "off":
        message = _refusal_with_remedies(plan, typed)
        if not rehearsal:
            raise DoesNotFitError(message)
        echo(f"on {profile.label} this run would be refused (hw.fit=off): {message}")
        return FitOutcome(plan, None, applied=False)

    decision = choose_fit(
        plan.planner,
        profile,
        plan.setup,
        (plan.train, plan.val),
        train_batch_size=train_request,
        val_batch_size=val_request,
        budget_bytes=plan.budget_bytes,
        typed=typed,
    )
    echo(decision.table())
    chosen = decision.chosen
    if chosen is None:
        if not rehearsal:
            raise DoesNotFitError(decision.refusal())
        echo(f"on {profile.label} this run would be refused: {decision.refusal()}")
        return FitOutcome(plan, decision, applied=False)
    line = " ".join(chosen.overrides)
    why = (
        f"the requested run needs train {plan.train.peak_gib:.2f} / val {plan.val.peak_gib:.2f} "
        f"GiB, over the {plan.budget_gib:.2f} GiB budget; {chosen.name} is the cheapest remedy "
        f"that fits ({chosen.train.peak_gib:.2f} / {chosen.val.peak_gib:.2f} GiB)"
    )
    if rehearsal:
        echo(
            f"on {profile.label} (hw.fit=auto) the run would apply: {line} ({why}); this CPU "
            f"rehearsal runs without it: append those overrides to rehearse it"
        )
        return FitOutcome(plan, decision, applied=False)
    echo(f"automatic fit (hw.fit=auto) applies: {line} ({why})")
    # `+hw.key=…` adds a key Hydra's config lacks; here detection has written `cfg.hw` already,
    # where the same value changes the key (the detected profile with the key on top either way).
    untyped = [o.lstrip("+") if o.lstrip("+").startswith("hw.") else o for o in chosen.overrides]
    append_overrides(cfg, untyped, conf_dir=conf_dir)
    return FitOutcome(plan, decision, applied=True)


def _refusal_with_remedies(plan: MemoryPlan, typed: Callable[[str], str]) -> str:
    remedies = propose_remedies(
        plan.planner, plan.profile, plan.setup, plan.train, plan.val, plan.budget_bytes
    )
    lines = [
        f"the run does not fit {plan.profile.label}'s budget of {plan.budget_gib:.2f} GiB "
        f"(train {plan.train.peak_gib:.2f} / val {plan.val.peak_gib:.2f} GiB at batch "
        f"{plan.train.batch_size} / {plan.val.batch_size}); hw.fit=off, so nothing is changed "
        "for you. Remedies (train / val GiB; append the overrides, or set hw.fit=auto):"
    ]
    for remedy in remedies:
        mark = "fits" if remedy.fits else "no  "
        how = " ".join(typed(o) for o in remedy.overrides)
        note = f" ({remedy.note})" if remedy.note else ""
        lines.append(
            f"  {mark}  {remedy.name}: {remedy.train.peak / GIB:.2f} / "
            f"{remedy.val.peak / GIB:.2f}  {how}{note}"
        )
    return "\n".join(lines)


def write_fit_decision(output_dir: Path, record: dict[str, Any]) -> Path:
    """Write `record` as `output_dir/fit_decision.json`; return the path."""
    path = Path(output_dir) / FIT_DECISION
    atomic_write_bytes(path, (json.dumps(record, indent=2) + "\n").encode())
    return path
