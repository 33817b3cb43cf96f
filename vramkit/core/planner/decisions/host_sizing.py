"""A run's host memory against the host's budget: a `cpu` run's batch sizes fitted into it, a GPU
run's pinned batches, loader workers and offloaded optimizer state checked against it.

The parts of each phase are `host_memory.HostPlanner`'s; this module decides with them: the
largest "auto" batch that fits, or a refusal naming the remedies.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from vramkit.core.hardware.profile import HardwareProfile
from vramkit.core.planner.decisions.host_memory import (
    HostBudget,
    HostPhasePlan,
    HostPlanner,
    LoaderSettings,
    host_budget,
    offloaded_bytes,
    process_baseline,
)
from vramkit.core.planner.decisions.plan import TRAIN, VAL
from vramkit.core.planner.decisions.task_plan import MemoryPlan, plan_task
from vramkit.core.planner.errors import DoesNotFitError
from vramkit.core.planner.request import PlanRequest
from vramkit.core.units import GIB


@dataclass(frozen=True)
class HostSizing:
    """The batch sizes a run takes within the host's memory, and their host plans."""

    train: HostPhasePlan
    val: HostPhasePlan
    budget: HostBudget
    traces: int
    """Phase traces the plan took."""
    seconds: float
    """Wall time of the planning (s)."""

    def line(self) -> str:
        """What was planned, for the run's log."""
        traced = f" ({self.traces} traces in {self.seconds:.1f} s)" if self.traces else ""
        return (
            f"host memory planned{traced}: train {self.train.summary()} at batch "
            f"{self.train.batch_size}, val {self.val.summary()} at batch {self.val.batch_size}; "
            f"budget {self.budget.describe()}"
        )

    def predictions(self, profile: HardwareProfile) -> dict[str, Any]:
        """The run folder's `memory_plan.json`: `peak_gib` is the main process's resident set,
        what MemoryMonitor's `mem/<phase>_peak_gib` reads on a CPU; `host` has every part."""
        return {
            "profile": profile.name,
            "precision": profile.precision,
            "budget_gib": self.budget.budget / GIB,
            **{
                plan.phase: {
                    "batch_size": plan.batch_size,
                    "peak_gib": plan.main_process / GIB,
                    "host": plan.parts_gib(),
                }
                for plan in (self.train, self.val)
            },
        }


def size_for_host_memory(
    request: PlanRequest,
    loader: LoaderSettings,
    budget: HostBudget,
    *,
    searched: tuple[bool, bool],
    typed: Callable[[str], str] = str,
) -> HostSizing:
    """Plan a `cpu` run's host memory and fit its batch sizes into `budget`.

    `request`'s batch sizes are the requested ones or, for a phase marked in `searched` ("auto"),
    the task's stated default, which the fitted size never exceeds: "auto" takes the largest
    size up to it that fits. Raises `DoesNotFitError` (one line, with the remedies) when a
    requested size, or batch size 1, does not fit; `PlanningError` when the run cannot be planned.
    """
    started = time.perf_counter()
    profile = request.profile
    plan = plan_task(request)
    host = HostPlanner(
        plan.planner,
        plan.setup,
        loader,
        baseline=process_baseline(),
        processes=plan.setup.sharding.world_size // max(profile.num_nodes, 1),
    )
    limit = budget.budget
    train, val = int(request.train_batch_size or 1), int(request.val_batch_size or 1)
    if searched[0]:
        upper = min(train, plan.train_limit or train)
        train = host.largest_batch_size(TRAIN, limit, upper, val)
    if searched[1]:
        upper = min(val, plan.val_limit or val)
        val = host.largest_batch_size(VAL, limit, upper, max(train, 1))
    train_plan = host.plan(TRAIN, max(train, 1), max(val, 1))
    val_plan = host.plan(VAL, max(val, 1), max(train, 1))
    over = [p for p in (train_plan, val_plan) if p.total > limit]
    if over:
        raise DoesNotFitError(_host_refusal(host, over[0], budget, train_plan, val_plan, typed))
    seconds = time.perf_counter() - started
    return HostSizing(train_plan, val_plan, budget, plan.planner.traces, seconds)


def _host_refusal(
    host: HostPlanner,
    over: HostPhasePlan,
    budget: HostBudget,
    train: HostPhasePlan,
    val: HostPhasePlan,
    typed: Callable[[str], str],
) -> str:
    limit = budget.budget
    head = (
        f"the run does not fit this host's memory: {over.phase} needs {over.summary()} at batch "
        f"{over.batch_size}, over the budget of {budget.describe()}"
    )
    remedies = []
    key = "batch_size" if over.phase == TRAIN else "val_batch_size"
    other = val.batch_size if over.phase == TRAIN else train.batch_size
    fitting = host.largest_batch_size(over.phase, limit, over.batch_size, other)
    if fitting:
        size = host.plan(over.phase, fitting, other).total / GIB
        remedies.append(f"{typed(f'hw.{key}={fitting}')} ({size:.2f} GiB)")
    if over.workers:
        remedies.append(f"{typed('hw.num_workers=0')} (saves {over.workers / GIB:.2f} GiB)")
    if not fitting:
        remedies.append(
            "at batch size 1 it still needs more: a smaller model or shorter inputs, or a "
            "machine with more free memory"
        )
    return f"{head}. Remedies: {'; '.join(remedies)}"


def check_gpu_host_memory(
    plan: MemoryPlan,
    loader: LoaderSettings,
    *,
    train_batch_size: int,
    val_batch_size: int,
    typed: Callable[[str], str] = str,
) -> HostSizing | None:
    """Check a GPU run's host memory: pinned batches, loader workers and the optimizer state
    DeepSpeed offloads (`trainer=deepspeed_zero2_offload`), against this host's memory.

    `plan` is the run's device plan (its planner, profile and setup: the strategy is its
    sharding's). Returns the host plan; None where the host's memory cannot be read. Raises
    `DoesNotFitError` (one line, with the remedies) when it does not fit.
    """
    profile = plan.profile
    budget = host_budget(profile.memory_budget_fraction)
    if budget is None:
        return None
    started = time.perf_counter()
    sharding = plan.setup.sharding
    per_node = max(sharding.world_size // max(profile.num_nodes, 1), 1)
    parameters = plan.planner.parameter_count(plan.setup)
    node_offload = offloaded_bytes(sharding.strategy, parameters, per_node)
    host = HostPlanner(
        plan.planner,
        plan.setup,
        loader,
        baseline=process_baseline(),
        processes=per_node,
        offloaded=node_offload // per_node,
    )
    train = host.plan(TRAIN, train_batch_size, val_batch_size)
    val = host.plan(VAL, val_batch_size, train_batch_size)
    sizing = HostSizing(train, val, budget, 0, time.perf_counter() - started)
    over = max(train, val, key=lambda p: p.total)
    if over.total <= budget.budget:
        return sizing
    remedies = []
    if over.pinned:
        remedies.append(f"{typed('hw.pin_memory=false')} (saves {over.pinned / GIB:.2f} GiB)")
    if over.workers:
        remedies.append(f"{typed('hw.num_workers=0')} (saves {over.workers / GIB:.2f} GiB)")
    if over.offloaded:
        remedies.append(
            f"a trainer without CPU offload, e.g. trainer=deepspeed_zero2 (saves "
            f"{over.offloaded * over.processes / GIB:.2f} GiB of host memory, takes GPU memory)"
        )
    if not remedies:
        remedies.append("free host memory, or a machine with more")
    raise DoesNotFitError(
        f"the run does not fit this host's memory: {over.phase} needs {over.summary()}, over the "
        f"budget of {budget.describe()}. Remedies: {'; '.join(remedies)}"
    )
