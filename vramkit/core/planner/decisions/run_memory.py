"""A run's memory, decided in one call: the planner's edge for `train.py` and `eval.py`.

`decide_run_memory` takes the run as asked (`RunMemoryRequest`: the `PlanRequest`, and how the
run goes) and returns every memory decision as one value (`RunMemory`): the automatic fit's
remedy or refusal, the "auto" batch sizes and accumulation, evaluation's inference batch, the
host's share, the lines that say why and the records for the run folder. It prints and writes
nothing; the run does, once it has decided (`vramkit.core.run.train`).

What runs depends on the mode:

- ``"device"``, a GPU run on its GPU: the requested run is planned against the budget (remedied
  or refused when over, `within_budget`), "auto" batch sizes are searched (`auto_batch`), an
  evaluation's batch is the inference plan's (`inference_plan`), and the host is checked for the
  pinned batches, loader workers and offloaded state (`host_sizing`);
- ``"rehearsal"``, a GPU profile rehearsed on a CPU (`hw.strict=false`): the lines say what its
  GPU would do; nothing is decided;
- ``"host"``, a `cpu` run: its batch sizes are fitted into the host's memory (`host_sizing`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from vramkit.core.hardware.profile import ProfileSource
from vramkit.core.planner.decisions.auto_batch import AutoBatchSizes, resolve_auto_batch_sizes
from vramkit.core.planner.decisions.host_memory import LoaderSettings, host_budget
from vramkit.core.planner.decisions.host_sizing import check_gpu_host_memory, size_for_host_memory
from vramkit.core.planner.decisions.inference_plan import settle_inference_batch
from vramkit.core.planner.decisions.task_plan import MemoryPlan
from vramkit.core.planner.decisions.within_budget import BudgetOutcome, plan_within_budget
from vramkit.core.planner.errors import DoesNotFitError, PlanningError
from vramkit.core.planner.request import BATCH_SIZE_KEYS, DEFAULTS_KEY, PlanRequest
from vramkit.core.units import GIB

Mode = Literal["device", "rehearsal", "host"]
"""How the run goes: a GPU run on its GPU, a GPU profile rehearsed on a CPU, a `cpu` run."""


@dataclass(frozen=True)
class RunMemoryRequest:
    """The run as asked, and how it goes: everything `decide_run_memory` decides from."""

    plan: PlanRequest
    """The run on the profile it is planned for, without remedies: on a GPU profile an "auto"
    size is None (searched); on a `cpu` one it is the task's stated default (the largest size
    tried)."""
    mode: Mode
    """See the module's docstring."""
    source: ProfileSource
    """The profile's file and overrides, for messages that name a key's origin."""
    loader: LoaderSettings
    """The run's loader settings: workers and pinned batches on the host."""
    searched: tuple[bool, bool] = (False, False)
    """(train, val): the size is "auto" (a `cpu` run's, whose request holds the default)."""
    training: bool = True
    """Plan the training run: its fit against the budget and its "auto" sizes. False for a run
    that trains nothing (`eval.py`, an export)."""
    check_fit: bool = True
    """Plan the requested run against the budget; False for the remedy the automatic fit chose
    (it fits by construction)."""
    inference: bool = False
    """`eval.py`: the validation batch is the inference plan's."""
    typed: Callable[[str], str] = str
    """Writes an override as the user appends it (``+hw.key=…`` without a ``+hw=`` profile)."""


@dataclass(frozen=True)
class RunMemory:
    """Every memory decision of one run, as values."""

    train_batch_size: int | None = None
    """The training batch per device; None: as asked."""
    val_batch_size: int | None = None
    """The validation (or evaluation) batch per device; None: as asked."""
    accumulate_grad_batches: int | None = None
    """None: as asked."""
    remedy: tuple[str, ...] = ()
    """The automatic fit's overrides, to compose into the run's config and settle again; ()
    when none is applied."""
    lines: tuple[str, ...] = ()
    """Each decision, for the console, in the order taken."""
    host_lines: tuple[str, ...] = ()
    """The GPU run's host memory, said after the accumulation is settled."""
    fit_record: dict[str, Any] | None = None
    """The run folder's `fit_decision.json`: what the automatic fit decided and why; None when
    the requested run fit or was not planned."""
    memory_plan: dict[str, Any] | None = None
    """The run folder's `memory_plan.json`: the predicted peaks at the settled sizes; None when
    nothing was planned."""


def decide_run_memory(request: RunMemoryRequest) -> RunMemory:
    """Decide `request`'s memory (see the module's docstring for what each mode decides).

    Raises `DoesNotFitError` (one message, with the remedies) when the run must be refused, and
    `ProfileError` for a profile that cannot be sized. A run the planner cannot trace is not
    refused: a line says so and "auto" takes the task's stated defaults.
    """
    if request.mode == "host":
        return _host_run(request)
    lines: tuple[str, ...] = ()
    record = None
    plan = None
    if request.training and request.check_fit:
        outcome = _within_budget(request)
        if isinstance(outcome, str):  # not traceable: said, and "auto" takes the defaults
            lines += (outcome,)
        else:
            lines += outcome.lines
            record = outcome.record()
            if outcome.applied:
                return RunMemory(remedy=outcome.remedy, lines=lines, fit_record=record)
            if request.mode == "device":
                plan = outcome.plan
    if request.mode == "rehearsal":
        return RunMemory(lines=lines, fit_record=record)
    return _device_run(request, plan, lines, record)


def _within_budget(request: RunMemoryRequest) -> BudgetOutcome | str:
    try:
        return plan_within_budget(
            request.plan, rehearsal=request.mode == "rehearsal", typed=request.typed
        )
    except DoesNotFitError:
        raise
    except PlanningError as error:
        return f"memory planner unavailable ({error}); the run is not checked against the budget"


def _device_run(
    request: RunMemoryRequest,
    plan: MemoryPlan | None,
    lines: tuple[str, ...],
    record: dict[str, Any] | None,
) -> RunMemory:
    """A GPU run that fits (or was not checked): "auto" sizes, the inference batch, the host."""
    asked = request.plan
    searched = None in (asked.train_batch_size, asked.val_batch_size)
    sizes = _auto_sizes(asked, plan) if request.training and searched else None
    train, val, accumulate = asked.train_batch_size, asked.val_batch_size, None
    predictions = None
    if isinstance(sizes, str):
        lines += (sizes,)
    elif sizes is not None:
        train, val, accumulate = sizes.train, sizes.val, sizes.accumulate
        lines += sizes.lines
        predictions = sizes.predictions
    if request.inference and asked.profile.budget_gib is not None:
        inference_request = _inference_request(asked, train, val, accumulate)
        inferred, said = settle_inference_batch(inference_request, request.source)
        lines += said
        val = inferred or val
    host_lines: tuple[str, ...] = ()
    if plan is not None and train is not None and val is not None:
        sizing = check_gpu_host_memory(
            plan,
            request.loader,
            train_batch_size=int(train),
            val_batch_size=int(val),
            typed=request.typed,
        )
        host_lines = (sizing.line(),) if sizing is not None else ()
    return RunMemory(
        train_batch_size=train,
        val_batch_size=val,
        accumulate_grad_batches=accumulate,
        lines=lines,
        host_lines=host_lines,
        fit_record=record,
        memory_plan=predictions,
    )


def _inference_request(
    asked: PlanRequest, train: int | None, val: int | None, accumulate: int | None
) -> PlanRequest:
    """The evaluation's request: the sizes decided so far, and no training batch (1)."""
    decided = {"batch_size": train, "val_batch_size": val, "accumulate_grad_batches": accumulate}
    profile = asked.profile.model_copy(
        update={key: value for key, value in decided.items() if value is not None}
    )
    return dataclasses.replace(
        asked,
        profile=profile,
        setup=asked.setup.replace(accumulate_grad_batches=profile.accumulate_grad_batches),
        train_batch_size=1,
        val_batch_size=val,
    )


def _auto_sizes(request: PlanRequest, plan: MemoryPlan | None) -> AutoBatchSizes | str:
    try:
        return resolve_auto_batch_sizes(request, plan)
    except DoesNotFitError:
        raise
    except PlanningError as error:
        return f"memory planner unavailable ({error}); 'auto' takes the task's stated defaults"


def _host_run(request: RunMemoryRequest) -> RunMemory:
    """A `cpu` run's batch sizes within the host's memory ("auto" the largest up to the task's
    stated default that fits, a set size checked), the lines that say so, and the host plan."""
    profile, source = request.plan.profile, request.source
    budget = host_budget(profile.memory_budget_fraction, memory_gib=profile.memory_gib)
    if budget is None:
        return RunMemory(
            lines=("host memory unknown (no /proc/meminfo): the run is not checked against it",)
        )
    lines: tuple[str, ...] = ()
    if budget.capped_from is not None:
        lines += (
            f"warning: hw.memory_gib {budget.capped_from:g} ({source.where('memory_gib')}) is "
            f"more than this process can have now; planned within {budget.available / GIB:.2f} "
            "GiB instead (other processes hold the rest)",
        )
    try:
        sizing = size_for_host_memory(
            request.plan, request.loader, budget, searched=request.searched, typed=request.typed
        )
    except DoesNotFitError:
        raise
    except PlanningError as error:
        return RunMemory(
            lines=(*lines, f"memory planner unavailable ({error}); host memory is not checked")
        )
    lines += (sizing.line(),)
    wanted = (request.plan.train_batch_size, request.plan.val_batch_size)
    sizes = (sizing.train.batch_size, sizing.val.batch_size)
    for (field, data_key), auto, asked, size in zip(
        BATCH_SIZE_KEYS, request.searched, wanted, sizes, strict=True
    ):
        if auto and size < asked:
            lines += (
                f"{field} 'auto' takes {size}, the largest that fits the host's memory or the "
                f"dataset's size ({DEFAULTS_KEY}.{data_key} is {asked})",
            )
    return RunMemory(
        train_batch_size=sizes[0],
        val_batch_size=sizes[1],
        lines=lines,
        memory_plan=sizing.predictions(profile),
    )
