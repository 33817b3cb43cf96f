"""Resolve `batch_size: auto` and `val_batch_size: auto` of a GPU profile with the planner."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from vramkit.core.hardware.profile import HardwareProfile
from vramkit.core.planner.decisions.plan import TRAIN
from vramkit.core.planner.decisions.remedies import split_batch
from vramkit.core.planner.decisions.task_plan import MemoryPlan, plan_task
from vramkit.core.planner.errors import DoesNotFitError, PlanningError
from vramkit.core.planner.request import DEFAULTS_KEY, PlanRequest
from vramkit.core.units import GIB


def _keep_effective_batch(
    plan: MemoryPlan, default: int | None, profile: HardwareProfile, largest: int
) -> tuple[int, int, str | None]:
    """Micro-batch and accumulation when the largest fitting batch is below the intended one."""
    intended = profile.target_effective_batch
    source = "hw.target_effective_batch"
    if intended is not None and profile.world_size > 1:
        # The target is the global batch; each process steps its share of it.
        source += f" / {profile.world_size} processes"
        intended = math.ceil(intended / profile.world_size)
    if intended is None:
        if default is None:
            return largest, profile.accumulate_grad_batches, None
        intended = default * profile.accumulate_grad_batches
        source = f"{DEFAULTS_KEY}.train"
    if largest * profile.accumulate_grad_batches >= intended:
        return largest, profile.accumulate_grad_batches, None
    budget = plan.budget_bytes
    limit = largest
    while limit >= 1:
        micro, accumulate = split_batch(intended, limit)
        setup = plan.setup.replace(accumulate_grad_batches=accumulate)
        if plan.planner.measure(TRAIN, micro, setup).peak <= budget:
            line = (
                f"training micro-batch {micro} × accumulate {accumulate} keeps the effective "
                f"batch {intended} ({source}); the largest single batch that fits is {largest}"
            )
            return micro, accumulate, line
        limit = micro - 1  # accumulating keeps old gradients through the backward pass
    raise DoesNotFitError(
        f"no micro-batch with accumulation fits {profile.name}'s budget for effective batch "
        f"{intended}; run scripts/plan_memory.py +hw={profile.name} for remedies"
    )


@dataclasses.dataclass(frozen=True)
class AutoBatchSizes:
    """What `resolve_auto_batch_sizes` decided: the sizes, the lines saying why, the prediction."""

    train: int
    """The training batch per device."""
    val: int
    """The validation batch per device."""
    accumulate: int
    """`accumulate_grad_batches`."""
    lines: tuple[str, ...]
    """What was chosen and why, for the console."""
    predictions: dict[str, Any] | None = None
    """A GPU plan's predicted peaks at the chosen sizes (the run folder's `memory_plan.json`);
    None without a GPU plan."""


def resolve_auto_batch_sizes(
    request: PlanRequest,
    plan: MemoryPlan | None = None,
) -> AutoBatchSizes:
    """Batch sizes for `request`'s searched (None) sizes, with the lines that say why.

    On a GPU profile the planner picks the largest training and validation batch sizes whose
    predicted peak fits `profile.budget_gib` (capped by the dataset sizes); when the training
    batch must be smaller than the intended effective batch (`hw.target_effective_batch`, else
    the task's `batch_size_defaults.train`), gradient accumulation keeps it. A CPU profile keeps
    the task's `batch_size_defaults`. Given sizes are returned unchanged. The lines say what
    was chosen and why, for the console. `plan` is this request's plan when one was made already
    (the same batch sizes asked for), to trace nothing twice.
    A GPU plan's ``predictions`` are the predicted peak of each phase at the chosen sizes, for the
    run's report:
    ``{"profile", "precision", "budget_gib", "train": {"batch_size", "accumulate_grad_batches",
    "peak_gib", "max_allocated_gib", "max_allocated_estimate_gib"}, "val": {...the same}}``
    (``peak_gib`` with the CUDA context and allocator reserve, as the budget counts it;
    ``max_allocated_gib`` what ``torch.cuda.max_memory_allocated`` should read, and
    ``max_allocated_estimate_gib`` what it should read with cuDNN workspaces at their estimate).
    """
    profile, defaults = request.profile, request.task_batch_defaults
    train_auto = request.train_batch_size is None
    val_auto = request.val_batch_size is None
    if profile.accelerator != "gpu" or profile.budget_gib is None:
        train = defaults.train if train_auto else request.train_batch_size
        val = defaults.val if val_auto else request.val_batch_size
        if train is None or val is None:
            raise PlanningError(
                f"profile {profile.name} has no GPU memory to plan for and the task states no "
                f"{DEFAULTS_KEY}; set hw.batch_size and hw.val_batch_size"
            )
        line = f"{profile.name}: no GPU budget to plan, batch sizes {train} / {val} (task defaults)"
        return AutoBatchSizes(train, val, profile.accumulate_grad_batches, (line,))

    if plan is None:
        plan = plan_task(dataclasses.replace(request, with_remedies=False))
    budget = plan.budget_bytes
    if plan.train.peak > budget or plan.val.peak > budget:
        phase = "training" if plan.train.peak > budget else "validation"
        worst = plan.train if phase == "training" else plan.val
        raise DoesNotFitError(
            f"the {phase} step does not fit {profile.label}'s budget of {plan.budget_gib:.2f} GiB "
            f"even at batch size {worst.batch_size} (predicted {worst.peak_gib:.2f} GiB); run "
            f"scripts/plan_memory.py +hw={profile.name} to see what would fit"
        )
    train, accumulate = plan.train.batch_size, profile.accumulate_grad_batches
    lines = [
        f"memory planner ({profile.name}, {plan.setup.precision}, budget {plan.budget_gib:.2f} "
        f"GiB; {plan.traces} traces in {plan.seconds:.1f} s): "
        + _phase_words(
            "training", plan.train.batch_size, plan.train.peak, train_auto, plan.train_limit
        )
        + ", "
        + _phase_words("validation", plan.val.batch_size, plan.val.peak, val_auto, plan.val_limit)
    ]
    if train_auto:
        train, accumulate, line = _keep_effective_batch(
            plan, defaults.train, profile, plan.train.batch_size
        )
        if line is not None:
            lines.append(line)
    train_phase = plan.train
    if (train, accumulate) != (plan.train.batch_size, profile.accumulate_grad_batches):
        accumulating = plan.setup.replace(accumulate_grad_batches=accumulate)
        train_phase = plan.planner.measure(TRAIN, train, accumulating)
    predictions = {
        "profile": profile.name,
        "precision": plan.setup.precision,
        "budget_gib": plan.budget_gib,
        "train": {
            "batch_size": train,
            "accumulate_grad_batches": accumulate,
            "peak_gib": train_phase.peak / GIB,
            "max_allocated_gib": train_phase.predicted_max_allocated / GIB,
            "max_allocated_estimate_gib": train_phase.max_allocated_estimate / GIB,
        },
        "val": {
            "batch_size": plan.val.batch_size,
            "peak_gib": plan.val.peak / GIB,
            "max_allocated_gib": plan.val.predicted_max_allocated / GIB,
            "max_allocated_estimate_gib": plan.val.max_allocated_estimate / GIB,
        },
    }
    return AutoBatchSizes(train, plan.val.batch_size, accumulate, tuple(lines), predictions)


def _phase_words(name: str, size: int, peak: int, searched: bool, limit: int | None) -> str:
    if not searched:
        return f"{name} batch {size} as set (peak {peak / GIB:.2f} GiB)"
    why = f"all {limit} samples" if limit == size else "the largest that fits"
    return f"{name} batch {size} ({why}, peak {peak / GIB:.2f} GiB)"
