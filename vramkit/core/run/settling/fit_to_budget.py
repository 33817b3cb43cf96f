"""Plan the requested run on its GPU profile and, when it is over budget, remedy it or refuse.

`vramkit.core.run.settling.resolve_hardware.settle_profile` calls `plan_within_budget` once the
profile is
checked against the device. With `hw.fit: auto` a run over budget takes the cheapest remedy that
fits (`vramkit.core.planner.decisions.auto_fit`): the table of what was traced is among the
returned lines, the chosen overrides are handed back to be composed into the run's config
(`vramkit.core.run.settling.settle`) before anything is built, and the decision is returned for the
run
folder (`fit_decision.json`). With `hw.fit: off` the run is refused with the remedies listed. A
GPU profile rehearsed on a CPU (`hw.strict=false`) says what it would do on its GPU and runs
without it. Nothing here prints or writes: the run does, once it has decided
(`vramkit.core.run.train`).
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from vramkit.core.config.settings_schemas import with_class_defaults
from vramkit.core.hardware.profile import HardwareProfile
from vramkit.core.io.checkpoint_io import atomic_write_bytes
from vramkit.core.planner.decisions.auto_fit import FitDecision, choose_fit
from vramkit.core.planner.decisions.host_memory import (
    DEFAULT_PREFETCH_FACTOR,
    HostBudget,
    HostPhasePlan,
    HostPlanner,
    LoaderSettings,
    host_budget,
    offloaded_bytes,
    process_baseline,
)
from vramkit.core.planner.decisions.plan import TRAIN, VAL
from vramkit.core.planner.decisions.remedies import propose_remedies
from vramkit.core.planner.decisions.task_plan import MemoryPlan, plan_task
from vramkit.core.planner.errors import DoesNotFitError
from vramkit.core.run.settling.plan_request_from_config import plan_request, run_sharding
from vramkit.core.units import GIB

FIT_DECISION = "fit_decision.json"
"""What the automatic fit decided, written into the run folder when the plan did not fit."""


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
        """The contents of `fit_decision.json`; None when the run fits."""
        if self.decision is None:
            return None
        planner = self.plan.planner
        return {**self.decision.as_json(), "applied": self.applied, "traces": planner.traces}


def plan_within_budget(
    cfg: DictConfig,
    profile: HardwareProfile,
    *,
    rehearsal: bool,
    typed: Callable[[str], str] = str,
) -> BudgetOutcome:
    """Plan `cfg` on the GPU `profile`; remedy it (`hw.fit: auto`) or refuse (`off`) when over.

    `rehearsal`: the run goes on a CPU (`hw.strict=false`), so "auto" batch sizes are traced at
    1, nothing is applied and nothing is refused: the lines say what the GPU run would do.
    `typed` writes an override as the user appends it. Raises `DoesNotFitError` (not on a
    rehearsal) when the run must be refused, and `PlanningError` when it cannot be planned.
    """
    request = plan_request(cfg, profile, with_remedies=False)
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


def write_fit_decision(output_dir: Path, record: dict[str, Any]) -> Path:
    """Write `record` as `output_dir/fit_decision.json`; return the path."""
    path = Path(output_dir) / FIT_DECISION
    atomic_write_bytes(path, (json.dumps(record, indent=2) + "\n").encode())
    return path


@dataclass(frozen=True)
class HostSizing:
    """The batch sizes a `cpu` run takes within the host's memory, and their host plans."""

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
    cfg: DictConfig,
    profile: HardwareProfile,
    budget: HostBudget,
    *,
    train_batch_size: int,
    val_batch_size: int,
    searched: tuple[bool, bool],
    typed: Callable[[str], str] = str,
) -> HostSizing:
    """Plan a `cpu` run's host memory and fit its batch sizes into `budget`.

    `train_batch_size` / `val_batch_size`: the requested sizes, or for a phase marked in
    `searched` ("auto") the task's stated default, which the fitted size never exceeds: "auto"
    takes the largest size up to it that fits. Raises `DoesNotFitError` (one line, with the
    remedies) when a requested size, or batch size 1, does not fit; `PlanningError` when the run
    cannot be planned.
    """
    started = time.perf_counter()
    plan = plan_task(
        plan_request(
            cfg, profile, batch_sizes=(train_batch_size, val_batch_size), with_remedies=False
        )
    )
    host = HostPlanner(
        plan.planner,
        plan.setup,
        loader_settings(cfg, profile),
        baseline=process_baseline(),
        processes=plan.setup.sharding.world_size // max(profile.num_nodes, 1),
    )
    limit = budget.budget
    train, val = train_batch_size, val_batch_size
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


def loader_settings(cfg: DictConfig, profile: HardwareProfile) -> LoaderSettings:
    """The run's loader settings: the data config's own values (a class default as its value:
    `with_class_defaults`), else the profile's."""
    data = cfg.get("data")
    plain = OmegaConf.to_container(data, resolve=False) if isinstance(data, DictConfig) else {}
    raw = with_class_defaults(plain)
    workers = raw.get("num_workers")
    pin = raw.get("pin_memory")
    prefetch = raw.get("prefetch_factor")
    persistent = raw.get("persistent_workers")
    return LoaderSettings(
        num_workers=workers if isinstance(workers, int) else profile.num_workers,
        prefetch_factor=prefetch if isinstance(prefetch, int) else DEFAULT_PREFETCH_FACTOR,
        pin_memory=pin if isinstance(pin, bool) else profile.pin_memory,
        persistent_workers=persistent if isinstance(persistent, bool) else True,
    )


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
    cfg: DictConfig,
    profile: HardwareProfile,
    plan: MemoryPlan,
    *,
    train_batch_size: int,
    val_batch_size: int,
    typed: Callable[[str], str] = str,
) -> HostSizing | None:
    """Check a GPU run's host memory: pinned batches, loader workers and the optimizer state
    DeepSpeed offloads (`trainer=deepspeed_zero2_offload`), against this host's memory.

    `plan` is the run's device plan (its planner and setup); the strategy is read from `cfg`'s
    trainer. Returns the host plan; None where the host's memory cannot be read. Raises
    `DoesNotFitError` (one line, with the remedies) when it does not fit.
    """
    budget = host_budget(profile.memory_budget_fraction)
    if budget is None:
        return None
    started = time.perf_counter()
    sharding = run_sharding(cfg, profile)
    per_node = max(sharding.world_size // max(profile.num_nodes, 1), 1)
    parameters = plan.planner.parameter_count(plan.setup)
    node_offload = offloaded_bytes(sharding.strategy, parameters, per_node)
    host = HostPlanner(
        plan.planner,
        plan.setup,
        loader_settings(cfg, profile),
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
