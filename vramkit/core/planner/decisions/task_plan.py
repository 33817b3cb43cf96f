"""Plan a run from a `PlanRequest` on its hardware profile: the entry point of the planner.

`plan_task` takes one sample per phase from the request's data factory and builds its
LightningModule (fake weights), traces training, validation inside fit and inference on its own,
searches the largest batch sizes where asked, and proposes remedies when the run does not fit.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from vramkit.core.hardware.profile import HardwareProfile
from vramkit.core.planner.decisions.plan import INFERENCE, TRAIN, VAL, MemoryPlanner, PhasePlan
from vramkit.core.planner.decisions.remedies import Remedy, propose_remedies
from vramkit.core.planner.request import PlanRequest
from vramkit.core.planner.tracing.recorder import GRADIENTS, OPTIMIZER_STATE, PARAMETERS
from vramkit.core.planner.tracing.run_setup import RunSetup
from vramkit.core.units import GIB


@dataclass(frozen=True)
class MemoryPlan:
    """The planner's answer for one profile: the three phases, the verdict and the remedies."""

    profile: HardwareProfile
    setup: RunSetup
    optimizer: str
    """The configured optimizer's class name (e.g. "AdamW")."""
    budget_bytes: int | None
    """The profile's memory budget; None for a CPU profile."""
    train: PhasePlan
    val: PhasePlan
    inference: PhasePlan
    """Evaluation on its own (`eval.py`): eval mode under `torch.inference_mode`, parameters and
    buffers only resident; the largest batch that fits when the validation batch is searched."""
    train_searched: bool
    """The training batch size is the largest that fits (it was "auto")."""
    val_searched: bool
    """The validation and inference batch sizes are the largest that fit (they were "auto")."""
    train_limit: int | None
    """The training dataset's size, which caps a searched batch size."""
    val_limit: int | None
    remedies: tuple[Remedy, ...]
    traces: int
    """Phase traces run to make this plan."""
    seconds: float
    """Wall time of the planning, sample loading included (s)."""
    planner: MemoryPlanner = field(repr=False, compare=False)
    """The planner that made this plan, to measure more setups with the same model and data."""

    @property
    def budget_gib(self) -> float | None:
        """`budget_bytes` in GiB."""
        return None if self.budget_bytes is None else self.budget_bytes / GIB

    @property
    def fits(self) -> bool | None:
        """Training and validation inside fit both fit the budget (None without a budget); the
        inference phase is planned for `eval.py`, a run of its own."""
        if self.budget_bytes is None:
            return None
        return self.train.peak <= self.budget_bytes and self.val.peak <= self.budget_bytes


def _resident(plan: PhasePlan) -> int:
    """Parameters, gradients and optimizer state at `plan`'s peak (bytes)."""
    held = plan.allocated
    return held[PARAMETERS] + held[GRADIENTS] + held[OPTIMIZER_STATE]


def task_planner(request: PlanRequest) -> MemoryPlanner:
    """A `MemoryPlanner` of `request`'s module, with one sample per phase from its data."""
    return MemoryPlanner(
        request.module,
        request.data(),
        bitsandbytes_optimizer=request.model.bitsandbytes_optimizer,
        model=request.model,
        max_epochs=request.max_epochs,
        max_steps=request.max_steps,
    )


def plan_task(request: PlanRequest) -> MemoryPlan:
    """Plan `request` on its profile.

    A batch size of None is searched: the largest that fits the profile's budget (capped by the
    dataset's size, else `request.largest_searched`), or 1 when nothing fits. Without a budget
    (CPU profile) every batch size must be given.
    """
    started = time.perf_counter()
    profile, setup = request.profile, request.setup
    train_batch_size, val_batch_size = request.train_batch_size, request.val_batch_size
    budget = request.budget_bytes
    if budget is None and (train_batch_size is None or val_batch_size is None):
        raise ValueError(
            f"profile {profile.name} has no memory budget, so batch sizes cannot be searched; "
            "give both batch sizes"
        )
    planner = task_planner(request)
    samples = planner.samples

    def phase(
        name: str, requested: int | None, limit: int | None, upper_first: bool = False
    ) -> PhasePlan:
        if requested is not None:
            return planner.measure(name, requested, setup)
        _, plan = planner.largest_batch_size(
            name, setup, budget, limit or request.largest_searched, upper_first=upper_first
        )
        return plan

    train = phase(TRAIN, train_batch_size, samples.train_size)
    # Validation keeps the training state resident. When that state leaves room, a validation
    # set often fits whole: tracing its full size first then settles the search in one trace.
    val = phase(VAL, val_batch_size, samples.val_size, upper_first=_resident(train) < (budget or 0))
    # Inference holds no training state: the validation set fits whole more often still.
    inference = phase(INFERENCE, val_batch_size, samples.val_size, upper_first=True)
    remedies: list[Remedy] = []
    over = budget is not None and (train.peak > budget or val.peak > budget)
    if request.with_remedies and over:
        remedies = propose_remedies(planner, profile, setup, train, val, budget)
    return MemoryPlan(
        profile=profile,
        setup=setup,
        optimizer=request.model.optimizer,
        budget_bytes=budget,
        train=train,
        val=val,
        inference=inference,
        train_searched=train_batch_size is None,
        val_searched=val_batch_size is None,
        train_limit=samples.train_size,
        val_limit=samples.val_size,
        remedies=tuple(remedies),
        traces=planner.traces,
        seconds=time.perf_counter() - started,
        planner=planner,
    )
