"""Plan evaluation on its own (`eval.py`): the inference phase alone, no training traces.

`eval.py`'s batch size on a GPU profile is the inference plan's, never a training plan's
(`settle_inference_batch`): evaluation runs `Trainer.validate` on its own, in eval mode under
`torch.inference_mode`, the parameters resident and nothing of training. "auto" takes the largest
batch the inference phase fits into the profile's budget; a size the user set is kept, and refused
before any work when that phase says it does not fit.

`plan_inference_batch_size` builds the request's module and one validation sample, then traces only
`trace_inference` (eval mode, no gradients, no optimizer state) to find the largest batch that
fits the profile's budget, or to check a batch size the user set. A full `plan_task` would also
trace two training steps and validation inside fit, which evaluation never runs.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from vramkit.core.hardware.profile import HardwareProfile, ProfileSource
from vramkit.core.planner.decisions.plan import INFERENCE, PhasePlan
from vramkit.core.planner.decisions.task_plan import task_planner
from vramkit.core.planner.errors import DoesNotFitError, PlanningError
from vramkit.core.planner.request import PlanRequest
from vramkit.core.units import GIB


@dataclass(frozen=True)
class InferenceBatchPlan:
    """The inference phase of one profile at the batch evaluation runs with."""

    profile: HardwareProfile
    precision: str
    """The precision the trace ran under (the profile's)."""
    budget_bytes: int
    inference: PhasePlan
    """The plan at the requested batch size (at most the validation set's size), or at the
    largest that fits when searched."""
    requested: int | None
    """The batch size the user set; None when it was searched ("auto")."""
    largest: int | None
    """The largest batch size that fits (0 when not even one sample does); None when a requested
    size fits, so nothing was searched."""
    limit: int | None
    """The validation dataset's size, which caps a searched batch size."""
    traces: int
    """Phase traces run, all of them of the inference phase."""
    seconds: float
    """Wall time of the planning, sample loading included (s)."""

    @property
    def fits(self) -> bool:
        """The planned batch size's peak stays within the budget."""
        return self.inference.peak <= self.budget_bytes

    def line(self) -> str:
        """One line for the console: batch, planned peak, budget, and how it was found."""
        size = self.inference.batch_size
        if self.requested is None:
            why = f"all {size} samples" if size == self.limit else "the largest that fits"
            batch = f"{size} ({why})"
        elif size < self.requested:
            batch = f"{self.requested} (as set; a batch holds all {size} samples)"
        else:
            batch = f"{size} (as set)"
        return (
            f"inference plan ({self.profile.name}, {self.precision}): eval batch {batch}, "
            f"planned peak {self.inference.peak_gib:.2f} GiB of budget "
            f"{self.budget_bytes / GIB:.2f} GiB; {self.traces} inference traces in "
            f"{self.seconds:.1f} s"
        )


def plan_inference_batch_size(request: PlanRequest) -> InferenceBatchPlan:
    """Plan `request`'s evaluation on its profile at `request.val_batch_size`, tracing the
    inference phase only.

    A batch size of None searches the largest batch whose predicted peak fits the profile's
    budget (capped by the validation set's size). A given size is traced as it runs (at most the
    validation set's size); when it does not fit, the largest smaller size that does is searched
    too, for the message that refuses it. Raises `ValueError` for a profile without a budget (a
    CPU profile plans nothing) and `PlanningError` when the task cannot be traced.
    """
    profile, setup, batch_size = request.profile, request.setup, request.val_batch_size
    budget = request.budget_bytes
    if budget is None:
        raise ValueError(f"profile {profile.name} has no memory budget to plan inference against")
    started = time.perf_counter()
    planner = task_planner(request)
    limit = planner.samples.val_size
    if batch_size is None:
        largest, inference = planner.largest_batch_size(
            INFERENCE, setup, budget, limit or request.largest_searched, upper_first=True
        )
    else:
        # A loader's batches hold at most the whole set: a larger size runs at the set's size.
        size = batch_size if limit is None else min(batch_size, limit)
        inference = planner.measure(INFERENCE, size, setup)
        largest = None
        if inference.peak > budget:
            largest = 0
            if size > 1:
                largest, _ = planner.largest_batch_size(INFERENCE, setup, budget, size - 1)
    return InferenceBatchPlan(
        profile=profile,
        precision=setup.precision,
        budget_bytes=budget,
        inference=inference,
        requested=batch_size,
        largest=largest,
        limit=limit,
        traces=planner.traces,
        seconds=time.perf_counter() - started,
    )


def settle_inference_batch(
    request: PlanRequest, source: ProfileSource
) -> tuple[int | None, tuple[str, ...]]:
    """The evaluation batch of `request` (a GPU profile; `val_batch_size` None for "auto"): the
    searched size, or None to keep the one set, and the line that says so (batch, planned peak,
    budget).

    Raises `DoesNotFitError` when a set `hw.val_batch_size` does not fit (naming the key, its
    file from `source` and the largest that fits) or when not even one sample fits.
    """
    profile = request.profile
    searched = request.val_batch_size is None
    try:
        plan = plan_inference_batch_size(request)
    except PlanningError as error:
        fallback = "'auto' takes the task's stated default" if searched else "it is not checked"
        return None, (f"memory planner unavailable ({error}); the eval batch size {fallback}",)
    if not plan.fits:
        budget = f"{profile.label}'s budget of {plan.budget_bytes / GIB:.2f} GiB for evaluation"
        peak = f"planned peak {plan.inference.peak_gib:.2f} GiB"
        if searched:
            raise DoesNotFitError(
                f"hw.val_batch_size=auto: not even batch size 1 fits {budget} ({peak}); run "
                f"scripts/plan_memory.py +hw={profile.name} to see the inference phase"
            )
        largest = (
            f"the largest that fits is {plan.largest}: set hw.val_batch_size={plan.largest}"
            if plan.largest
            else "not even batch size 1 fits"
        )
        raise DoesNotFitError(
            f"hw.val_batch_size={profile.val_batch_size} ({source.where('val_batch_size')}) "
            f"does not fit {budget} ({peak}); {largest}"
        )
    # The user's size stands (a loader caps it at the set's size itself).
    return (plan.inference.batch_size if searched else None), (plan.line(),)
