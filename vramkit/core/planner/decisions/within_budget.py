"""Plan the requested run on its GPU profile and, when it is over budget, remedy it or refuse.

With `hw.fit: auto` a run over budget takes the cheapest remedy that fits
(`vramkit.core.planner.decisions.auto_fit`): the table of what was traced is among the returned
lines and the chosen overrides are handed back, for the run to compose into its config before
anything is built. With `hw.fit: off` the run is refused with the remedies listed. A GPU profile
rehearsed on a CPU (`hw.strict=false`) says what it would do on its GPU and runs without it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from vramkit.core.planner.decisions.auto_fit import FitDecision, choose_fit
from vramkit.core.planner.decisions.remedies import propose_remedies
from vramkit.core.planner.decisions.task_plan import MemoryPlan, plan_task
from vramkit.core.planner.errors import DoesNotFitError
from vramkit.core.planner.request import PlanRequest
from vramkit.core.units import GIB


@dataclass(frozen=True)
class BudgetOutcome:
    """What planning the requested run against its budget found and decided."""

    plan: MemoryPlan
    """The requested run's plan (before any remedy)."""
    decision: FitDecision | None
    """The automatic fit's candidates and choice; None when the run fits."""
    applied: bool
    """The chosen overrides are for the run to apply (not on a CPU rehearsal)."""
    lines: tuple[str, ...] = ()
    """What was found and decided, for the console (the table of remedies traced included)."""

    @property
    def remedy(self) -> tuple[str, ...]:
        """The applied remedy's overrides, appended to the user's to compose the run's config:
        `hw.` keys as `++hw.key=…` (added or replaced, with or without a `+hw=` profile); () when
        nothing is applied."""
        if not self.applied or self.decision is None or self.decision.chosen is None:
            return ()
        return tuple(
            f"++{o.lstrip('+')}" if o.lstrip("+").startswith("hw.") else o
            for o in self.decision.chosen.overrides
        )

    def record(self) -> dict[str, Any] | None:
        """The contents of the run folder's `fit_decision.json`; None when the run fits."""
        if self.decision is None:
            return None
        planner = self.plan.planner
        return {**self.decision.as_json(), "applied": self.applied, "traces": planner.traces}


def plan_within_budget(
    request: PlanRequest, *, rehearsal: bool, typed: Callable[[str], str] = str
) -> BudgetOutcome:
    """Plan `request` on its GPU profile; remedy it (`hw.fit: auto`) or refuse (`off`) when over.

    `rehearsal`: the run goes on a CPU (`hw.strict=false`), so "auto" batch sizes are traced at
    1, nothing is applied and nothing is refused: the lines say what the GPU run would do.
    `typed` writes an override as the user appends it. Raises `DoesNotFitError` (not on a
    rehearsal) when the run must be refused, and `PlanningError` when it cannot be planned.
    """
    profile = request.profile
    train_request, val_request = request.train_batch_size, request.val_batch_size
    if rehearsal:
        request = dataclasses.replace(
            request, train_batch_size=train_request or 1, val_batch_size=val_request or 1
        )
    plan = plan_task(request)
    if plan.fits:
        line = (
            f"on {profile.label} the run fits: train {plan.train.peak_gib:.2f} / val "
            f"{plan.val.peak_gib:.2f} GiB of {plan.budget_gib:.2f} GiB"
        )
        return BudgetOutcome(plan, None, applied=False, lines=(line,) if rehearsal else ())
    if profile.fit == "off":
        message = _refusal_with_remedies(plan, typed)
        if not rehearsal:
            raise DoesNotFitError(message)
        line = f"on {profile.label} this run would be refused (hw.fit=off): {message}"
        return BudgetOutcome(plan, None, applied=False, lines=(line,))

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
    table = decision.table()
    chosen = decision.chosen
    if chosen is None:
        if not rehearsal:
            raise DoesNotFitError(decision.refusal())
        line = f"on {profile.label} this run would be refused: {decision.refusal()}"
        return BudgetOutcome(plan, decision, applied=False, lines=(table, line))
    line = " ".join(chosen.overrides)
    why = (
        f"the requested run needs train {plan.train.peak_gib:.2f} / val {plan.val.peak_gib:.2f} "
        f"GiB, over the {plan.budget_gib:.2f} GiB budget; {chosen.name} is the cheapest remedy "
        f"that fits ({chosen.train.peak_gib:.2f} / {chosen.val.peak_gib:.2f} GiB)"
    )
    if rehearsal:
        said = (
            f"on {profile.label} (hw.fit=auto) the run would apply: {line} ({why}); this CPU "
            f"rehearsal runs without it: append those overrides to rehearse it"
        )
        return BudgetOutcome(plan, decision, applied=False, lines=(table, said))
    said = f"automatic fit (hw.fit=auto) applies: {line} ({why})"
    return BudgetOutcome(plan, decision, applied=True, lines=(table, said))


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
