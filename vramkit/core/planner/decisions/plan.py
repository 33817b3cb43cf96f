"""Plan a run's device memory per phase and find the largest batch sizes under the budget.

`MemoryPlanner` holds the task's module factory and one sample batch per phase; `measure` traces a
phase at a batch size under a `RunSetup` and returns a `PhasePlan`: what is allocated at the peak
(parameters, gradients, optimizer state, activations and temporaries including the batch) plus
the device overhead (CUDA context, library workspaces, allocator reserve). `largest_batch_size`
searches the batch axis with few traces: the peak grows with the batch as the maximum of
straight lines (one per moment of the step), a convex curve, so the chord between a fitting and
a failing size lies above it (where the chord meets the budget surely fits) and the secant
through the two largest fitting sizes, extended, lies below it (beyond where it meets the budget
nothing fits). The search measures inside what those two leave open until they agree.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from torch._subclasses.fake_tensor import FakeTensorMode

from vramkit.core.planner.cuda.cuda_rules import TRUE_PRECISIONS
from vramkit.core.planner.cuda.optimizer_layouts import (
    BITSANDBYTES_LAYOUTS,
    CONFIGURED,
    PAGED_LAYOUTS,
    ZERO2,
    ZERO2_OFFLOAD,
    paged_state_bytes,
)
from vramkit.core.planner.decisions.llm_allowance import (
    LLM_ALLOWANCE,
    is_adapter_causal_lm,
    llm_activation_allowance,
)
from vramkit.core.planner.request import ModelFacts, ModuleFactory
from vramkit.core.planner.shortcuts.output_memo import OutputMemo
from vramkit.core.planner.tracing.batches import PhaseSamples, cast_floating, grow_batch
from vramkit.core.planner.tracing.block_extrapolation import (
    SHORT_COUNTS,
    carried_total,
    rebuilt_trace,
)
from vramkit.core.planner.tracing.fake_trace import (
    OPTIMIZER_STEP,
    FakeStepRecorder,
    StepTrace,
    batch_tensors,
    cuda_semantics,
    trace_inference,
    trace_training,
    trace_validation,
)
from vramkit.core.planner.tracing.peak_holders import WORKSPACE, Holder
from vramkit.core.planner.tracing.recorder import (
    ACTIVATIONS,
    GRADIENTS,
    INPUTS,
    OPTIMIZER_STATE,
    PARAMETERS,
)
from vramkit.core.planner.tracing.repeated_blocks import cut_to, keep_first, repeated_blocks
from vramkit.core.planner.tracing.run_setup import RunSetup
from vramkit.core.planner.tracing.sharding import ZERO2_OFFLOAD as OFFLOADED_ZERO2
from vramkit.core.planner.tracing.sharding import model_states, shard_allocated, traced_precision
from vramkit.core.planner.tracing.subject import (
    build_meta_module,
    build_optimizer,
    finish_module,
)
from vramkit.core.quantization.bitsandbytes_rules import PlannedBitsandbytes, planned_bitsandbytes
from vramkit.core.quantization.planned_linear import PlannedQuantizedLinear
from vramkit.core.units import GIB

TRAIN = "train"
VAL = "val"
INFERENCE = "inference"
"""Evaluation on its own (`eval.py`): eval mode, `torch.inference_mode`, no training state."""
PHASES = (TRAIN, VAL, INFERENCE)
_WITHOUT_GRAD = (VAL, INFERENCE)

_MAX_SEARCH_STEPS = 24  # traces per search; the secant search needs 3-5 on typical models


@dataclass(frozen=True)
class PhasePlan:
    """The predicted device memory of one phase at one batch size (bytes)."""

    phase: str
    batch_size: int
    accumulate_grad_batches: int
    allocated: dict[str, int]
    """Bytes allocated at the peak by category (parameters, gradients, …, inputs, activations)."""
    overhead: int
    """CUDA context, library workspaces and allocator reserve at the peak (0 on CPU)."""
    workspace: int
    """The library workspaces within `overhead`: blocks the caching allocator hands out too."""
    peak_at: str
    """When the peak happens, e.g. "step 2: backward"."""
    attention_kernels: tuple[str, ...] = ()
    holders: tuple[Holder, ...] = ()
    """The largest groups of tensors live at the peak, by module and kind (`peak_holders`)."""
    allocated_with_workspaces: int = 0
    """The traced peak with the cuDNN workspace each convolution takes when memory is to spare,
    each at its estimate (`op_rules.cudnn_convolution_workspace_bytes`); `peak` keeps room for
    it (`workspace_room`) (bytes). Per device as `allocated` is: the model states live at that
    moment are sharded by the same rule, the workspace (one device's own call) is not."""
    max_allocated_holders: tuple[Holder, ...] = ()
    """What is live at that moment (`holders` when no workspace rises above the peak)."""
    at_least: bool = False
    """The phase was not traced: `peak` is a certain lower bound taken from a related trace
    (`MemoryPlanner.training_floor`)."""
    cuda_context: int = 0
    """The CUDA context within `overhead` (bytes; 0 without a target device)."""
    paged_optimizer_state: int = 0
    """A paged bitsandbytes optimizer's moments in CUDA unified memory (bytes): host memory,
    outside `allocated` and `torch.cuda.max_memory_allocated` (`PagedAdamWLayout`)."""
    bitsandbytes: PlannedBitsandbytes | None = None
    """The bitsandbytes release whose rules the trace applied, when it planned quantized layers
    or a bitsandbytes optimizer; None otherwise."""

    @property
    def allocated_peak(self) -> int:
        """Bytes the traced step holds at its peak (the trace's own allocations)."""
        return sum(self.allocated.values())

    @property
    def predicted_max_allocated(self) -> int:
        """What `torch.cuda.max_memory_allocated()` should read after this phase (bytes) when
        cuDNN's convolutions take no workspace beyond the traced step (the implicit-GEMM
        engines need none); `max_allocated_estimate` is the reading with their workspaces."""
        return self.allocated_peak + self.workspace

    @property
    def max_allocated_estimate(self) -> int:
        """What `torch.cuda.max_memory_allocated()` should read after this phase (bytes) with
        every convolution's cuDNN workspace at its estimate (`op_rules`, an estimate within
        `CUDNN_ESTIMATE_BAND`, not a bound), taken with memory to spare."""
        return max(self.allocated_peak, self.allocated_with_workspaces) + self.workspace

    @property
    def workspace_room(self) -> int:
        """Bytes the budget keeps beyond `overhead` so that the device holds the CUDA context
        plus `max_allocated_estimate`: cuDNN's heuristic engine then finds its workspace free
        (with less, Conv_v8.cpp `try_configs` runs a smaller-workspace engine, slower)."""
        in_use = self.allocated_peak + self.overhead
        return max(0, self.cuda_context + self.max_allocated_estimate - in_use)

    @property
    def peak(self) -> int:
        """Device memory the budget holds for the phase (bytes): the allocations at the peak,
        the overhead, and room for the estimated cuDNN workspaces (`workspace_room`)."""
        return self.allocated_peak + self.overhead + self.workspace_room

    @property
    def peak_gib(self) -> float:
        """`peak` in GiB."""
        return self.peak / GIB

    def peak_text(self, digits: int = 2) -> str:
        """`peak_gib` for a table, "≥ " before it when it is a bound (`at_least`)."""
        return f"{'≥ ' if self.at_least else ''}{self.peak_gib:.{digits}f}"

    def breakdown_gib(self) -> dict[str, float]:
        """Parameters, gradients, optimizer state, activations (with the batch), overhead (with
        the `workspace_room`), total."""
        a = self.allocated
        return {
            "parameters": a[PARAMETERS] / GIB,
            "gradients": a[GRADIENTS] / GIB,
            "optimizer_state": a[OPTIMIZER_STATE] / GIB,
            "activations": (a[ACTIVATIONS] + a[INPUTS] + a.get(LLM_ALLOWANCE, 0)) / GIB,
            "overhead": (self.overhead + self.workspace_room) / GIB,
            "total": self.peak / GIB,
        }

    @property
    def llm_activation_allowance(self) -> int:
        """The `LLM_ACTIVATION_ALLOWANCE` share within `allocated` (bytes; 0 when not applied)."""
        return self.allocated.get(LLM_ALLOWANCE, 0)

    def fits(self, budget_bytes: int | None) -> bool | None:
        """Whether the peak stays within `budget_bytes` (None without a budget)."""
        return None if budget_bytes is None else self.peak <= budget_bytes


@dataclass
class _Subject:
    fake_mode: FakeTensorMode
    module: Any
    blocks: Any = None
    """In a model cut to `SHORT_COUNTS[-1]` of its repeated blocks (`_short_subject`): that
    block list; None in a whole model."""
    block_count: int = 0
    """How many blocks the whole model has (0 in a whole model)."""


def _scalar_stand_in(batch: Any) -> int:
    return max((t.numel() for t in batch_tensors(batch)), default=1)


def _input_dtype(precision: str) -> Any:
    # Lightning's *-true precisions (except 32-true) convert floating inputs to their dtype.
    return None if precision == "32-true" else TRUE_PRECISIONS.get(precision)


def _traced_setup(setup: RunSetup) -> RunSetup:
    """The setup a trace runs: the precision the weights have on the device, and DeepSpeed's
    own optimizer layout under ZeRO-2 with CPU offload."""
    setup = setup.replace(precision=traced_precision(setup.sharding, setup.precision))
    if setup.sharding.strategy == OFFLOADED_ZERO2:
        # Nothing of the optimizer stays on the device, whatever the world size: DeepSpeed's
        # own layout traces that exactly (gradients leave as produced, no device step).
        setup = setup.replace(optimizer=ZERO2_OFFLOAD)
    return setup


@dataclass
class MemoryPlanner:
    """Traces the task's steps under any `RunSetup` and batch size; remembers what it measured."""

    module_factory: ModuleFactory
    """Builds the task's LightningModule with a setup's `model_overrides` (`PlanRequest.module`)."""
    samples: PhaseSamples
    bitsandbytes_optimizer: str | None = None
    """The layout of the bitsandbytes optimizer the model's config names (planned as torch's
    AdamW with that layout), None for any other optimizer."""
    model: ModelFacts = field(default_factory=ModelFacts)
    """How the module is configured, for the remedies (`PlanRequest.model`)."""
    max_epochs: int = 1
    max_steps: int = -1
    tied_loaded_twice: bool = False
    """The inference phase's weights are loaded by transformers' `from_pretrained` onto the
    device (a tied weight once per name, then tied), not moved there by Lightning
    (`trace_inference`)."""
    traces: int = 0
    """How many phase traces ran (a cached measurement does not count)."""
    extrapolate_blocks: bool = True
    """Rebuild a phase's trace from the model cut to a few of its repeated blocks where those
    traces repeat exactly (`block_extrapolation`); False traces every block."""
    rebuilt_traces: int = 0
    """How many of `traces` were rebuilt from cut models."""
    _subjects: dict[tuple, _Subject] = field(default_factory=dict, repr=False)
    _short_subjects: dict[tuple, _Subject | None] = field(default_factory=dict, repr=False)
    _output_memo: OutputMemo = field(default_factory=OutputMemo, repr=False)
    _measured: dict[tuple, PhasePlan] = field(default_factory=dict, repr=False)

    def _subject(self, setup: RunSetup) -> _Subject:
        """The whole model `setup` builds, traced as it is."""
        key = setup.module_key
        if key not in self._subjects:
            meta = build_meta_module(functools.partial(self.module_factory, setup.model_overrides))
            self._subjects[key] = self._finished(meta, setup)
        return self._subjects[key]

    def _short_subject(self, setup: RunSetup) -> _Subject | None:
        """The model `setup` builds cut to `SHORT_COUNTS[-1]` of its repeated blocks, for the
        short traces (`_rebuilt`); None when it has no more blocks than that.

        A module of its own: a trace can change the module it runs (bitsandbytes converts a
        4-bit layer's bias to the input's dtype on its first call), so the whole model traced
        after short traces must be the one a plan without them would have traced. Where there
        are no repeated blocks, the build becomes the whole model (`_subject`).
        """
        key = setup.module_key
        if key not in self._short_subjects:
            meta = build_meta_module(functools.partial(self.module_factory, setup.model_overrides))
            blocks = repeated_blocks(meta)
            short = None
            if blocks is None or len(blocks) <= SHORT_COUNTS[-1]:
                if key not in self._subjects:
                    self._subjects[key] = self._finished(meta, setup)
            else:
                count = len(blocks)
                keep_first(blocks, SHORT_COUNTS[-1])
                short = dataclasses.replace(
                    self._finished(meta, setup), blocks=blocks, block_count=count
                )
            self._short_subjects[key] = short
        return self._short_subjects[key]

    @staticmethod
    def _finished(meta: Any, setup: RunSetup) -> _Subject:
        fake_mode = FakeTensorMode()
        return _Subject(fake_mode, finish_module(meta, setup, fake_mode))

    def measure(self, phase: str, batch_size: int, setup: RunSetup) -> PhasePlan:
        """Trace `phase` ("train", "val" or "inference") at `batch_size` under `setup`."""
        if phase not in PHASES:
            raise ValueError(f"phase must be one of {PHASES}, got {phase!r}")
        if phase in _WITHOUT_GRAD:
            # Validation and inference run without grad: checkpointing, accumulation and
            # activation offload change nothing there, so remedies that differ only in them share
            # one trace.
            setup = setup.replace(
                gradient_checkpointing=False, accumulate_grad_batches=1, activation_offload=False
            )
        key = (phase, batch_size, setup)
        if key not in self._measured:
            self._measured[key] = self._trace(phase, batch_size, setup)
        return self._measured[key]

    def parameter_count(self, setup: RunSetup) -> int:
        """Parameters of the module `setup` builds (LoRA and other model overrides applied)."""
        return sum(p.numel() for p in self._subject(_traced_setup(setup)).module.parameters())

    def paged_optimizer_bytes(self, setup: RunSetup) -> int:
        """Host (CUDA unified) memory of a paged bitsandbytes optimizer's states under `setup`
        (bytes; 0 for any other optimizer layout), from the trainable parameters, no trace."""
        layout = setup.optimizer
        if layout == CONFIGURED and self.bitsandbytes_optimizer is not None:
            layout = self.bitsandbytes_optimizer
        bits = PAGED_LAYOUTS.get(layout)
        if bits is None:
            return 0
        module = self._subject(_traced_setup(setup)).module
        return paged_state_bytes((p for p in module.parameters() if p.requires_grad), bits)

    def training_floor(self, batch_size: int, setup: RunSetup) -> PhasePlan | None:
        """A certain lower bound on `setup`'s training peak at `batch_size` without tracing it,
        or None when there is none to take.

        Gradient checkpointing and activation offload change only what a training forward keeps
        for backward. Parameters, gradients, optimizer state and the optimizer step stay as they
        are, and nothing of the forward is alive by then. So when the same setup without them
        has been traced and its peak lies in an optimizer step, `setup` allocates at least as
        much, plus the CUDA context and the least reserve the allocator keeps
        (`overhead_bytes` with no events beyond the workspaces). Where that bound is over the
        budget, tracing `setup` cannot change the verdict. Raises `PlanningError` when the
        change does not apply to the model (no blocks to checkpoint).
        """
        reference = setup.replace(gradient_checkpointing=False, activation_offload=False)
        traced = self._measured.get((TRAIN, batch_size, reference))
        if reference == setup or traced is None or not traced.peak_at.endswith(OPTIMIZER_STEP):
            return None
        traced_setup = _traced_setup(setup)
        if not (self.extrapolate_blocks and self._short_subject(traced_setup)):
            self._subject(traced_setup)
        overhead = 0
        if setup.device is not None:
            overhead = setup.device.overhead_bytes(traced.allocated_peak, (), backward=True)
        return dataclasses.replace(
            traced,
            overhead=overhead,
            allocated_with_workspaces=traced.allocated_peak,
            max_allocated_holders=traced.holders,
            at_least=True,
        )

    def training_verdict(self, batch_size: int, setup: RunSetup, budget_bytes: int) -> PhasePlan:
        """`setup`'s training plan at `batch_size`, or its `training_floor` when that bound alone
        is over `budget_bytes`: the verdict (does not fit) is then certain without a trace."""
        floor = self.training_floor(batch_size, setup)
        if floor is not None and floor.peak > budget_bytes:
            return floor
        return self.measure(TRAIN, batch_size, setup)

    def _trace(self, phase: str, batch_size: int, setup: RunSetup) -> PhasePlan:
        setup = _traced_setup(setup)
        rebuilt = self._rebuilt(phase, batch_size, setup)
        if rebuilt is not None:
            trace, paged, module = rebuilt
            self.rebuilt_traces += 1
        else:
            subject = self._subject(setup)
            trace, paged, _ = self._traced(phase, batch_size, setup, subject)
            module = subject.module
        self.traces += 1
        plan = dataclasses.replace(
            self._phase_plan(phase, batch_size, setup, trace),
            paged_optimizer_state=paged,
            bitsandbytes=self._bitsandbytes(module, setup),
        )
        if setup.sharding.sharded and setup.optimizer not in (ZERO2, ZERO2_OFFLOAD):
            # The trace is one process holding everything; the run's device holds its share.
            states = model_states(module, setup.sharding.wrap_classes)

            def per_device(allocated: dict[str, int]) -> dict[str, int]:
                return shard_allocated(
                    allocated, states, setup.sharding, setup.precision, backward=phase == TRAIN
                )

            # The workspace moment's model states are sharded as the peak's; the workspace is
            # each device's own convolution call, as large as in the trace.
            at_workspace = dict(trace.max_allocated_breakdown)
            workspace = at_workspace.pop(WORKSPACE, 0)
            plan = dataclasses.replace(
                plan,
                allocated=per_device(plan.allocated),
                allocated_with_workspaces=sum(per_device(at_workspace).values()) + workspace,
            )
        if phase == TRAIN and setup.device is not None and is_adapter_causal_lm(module):
            plan = _with_llm_allowance(plan)
        return plan

    def _traced(
        self, phase: str, batch_size: int, setup: RunSetup, subject: _Subject
    ) -> tuple[StepTrace, int, FakeStepRecorder]:
        """Trace `phase` on `subject` as it stands; the trace, the paged optimizer bytes and
        the recorder (its log)."""
        sample = self.samples.train if phase == TRAIN else self.samples.val
        module = subject.module
        with cuda_semantics(setup) as (semantics, attention), subject.fake_mode:
            batch = grow_batch(sample, batch_size)
            if self.samples.after_transfer is not None:
                batch = self.samples.after_transfer(batch)
            batch = cast_floating(batch, _input_dtype(setup.precision))
            optimizer = build_optimizer(
                module,
                setup,
                configured_layout=self.bitsandbytes_optimizer,
                max_epochs=self.max_epochs,
                max_steps=self.max_steps,
            )
            recorder = FakeStepRecorder(
                scalar_stand_in=_scalar_stand_in(batch),
                round_to_device=setup.device is not None,
                keep_timeline=False,
                output_memo=self._output_memo,
            )
            if phase == TRAIN:
                trace = trace_training(
                    module, optimizer, batch, recorder, semantics, attention=attention
                )
            elif phase == INFERENCE:
                trace = trace_inference(
                    module,
                    batch,
                    recorder,
                    semantics,
                    attention=attention,
                    tied_loaded_twice=self.tied_loaded_twice,
                )
            else:
                trace = trace_validation(
                    module, optimizer, batch, recorder, semantics, attention=attention
                )
            paged = getattr(optimizer, "paged_bytes", 0)
            del optimizer, batch
            module.zero_grad(set_to_none=True)
        return trace, paged, recorder

    def _rebuilt(
        self, phase: str, batch_size: int, setup: RunSetup
    ) -> tuple[StepTrace, int, Any] | None:
        """`phase`'s trace and paged optimizer bytes rebuilt from the model cut to
        `SHORT_COUNTS` of its repeated blocks (`block_extrapolation`), with the cut module; None
        where that does not apply or the short traces do not repeat exactly (the caller then
        traces the whole model)."""
        if not self.extrapolate_blocks or setup.sharding.sharded:
            return None
        subject = self._short_subject(setup)
        if subject is None:
            return None
        traces, paged, recorders = [], [], []
        for count in SHORT_COUNTS:
            with cut_to(subject.blocks, count):
                trace, paged_bytes, recorder = self._traced(phase, batch_size, setup, subject)
            traces.append(trace)
            paged.append(paged_bytes)
            recorders.append(recorder)
        carried = carried_total(paged, subject.block_count)
        if carried is None:
            return None
        trace = rebuilt_trace(recorders, traces, subject.block_count)
        return None if trace is None else (trace, carried, subject.module)

    def _bitsandbytes(self, module: Any, setup: RunSetup) -> PlannedBitsandbytes | None:
        # The release the quantized layers were built with, else the one the optimizer used.
        for sub in module.modules():
            if isinstance(sub, PlannedQuantizedLinear):
                return sub.bitsandbytes
        if self.bitsandbytes_optimizer or setup.optimizer in BITSANDBYTES_LAYOUTS:
            return planned_bitsandbytes()
        return None

    @staticmethod
    def _phase_plan(phase: str, batch_size: int, setup: RunSetup, trace: StepTrace) -> PhasePlan:
        overhead = workspace = 0
        if setup.device is not None:
            backward = phase == TRAIN
            overhead = setup.device.overhead_bytes(
                trace.peak_bytes,
                trace.events,
                backward=backward,
            )
            workspace = setup.device.workspace_bytes(backward=backward)
        return PhasePlan(
            phase=phase,
            batch_size=batch_size,
            accumulate_grad_batches=setup.accumulate_grad_batches if phase == TRAIN else 1,
            allocated=dict(trace.breakdown),
            overhead=overhead,
            workspace=workspace,
            cuda_context=setup.device.cuda_context_bytes() if setup.device is not None else 0,
            peak_at=trace.peak_at,
            attention_kernels=tuple(sorted(set(trace.attention_kernels))),
            holders=trace.holders,
            allocated_with_workspaces=trace.max_allocated_bytes,
            max_allocated_holders=trace.max_allocated_holders,
        )

    def largest_batch_size(
        self,
        phase: str,
        setup: RunSetup,
        budget_bytes: int,
        upper: int,
        *,
        upper_first: bool = False,
    ) -> tuple[int, PhasePlan]:
        """The largest batch size in 1..`upper` whose peak fits `budget_bytes`, and its plan.

        Returns 0 and the plan at batch size 1 when not even one sample fits. `upper_first`
        traces `upper` before 1 (see `largest_fitting`); the answer is the same either way.
        """
        best = largest_fitting(
            lambda size: self.measure(phase, size, setup).peak,
            budget_bytes,
            upper,
            upper_first=upper_first,
        )
        return best, self.measure(phase, max(best, 1), setup)


def _with_llm_allowance(plan: PhasePlan) -> PhasePlan:
    """`plan` with `LLM_ACTIVATION_ALLOWANCE` of its activations at the peak added to what is
    allocated there (and at the workspace moment), as its own category."""
    extra = llm_activation_allowance(plan.allocated[ACTIVATIONS])
    return dataclasses.replace(
        plan,
        allocated={**plan.allocated, LLM_ALLOWANCE: extra},
        allocated_with_workspaces=plan.allocated_with_workspaces + extra,
    )


def largest_fitting(
    peak_of: Callable[[int], int], budget: int, upper: int, *, upper_first: bool = False
) -> int:
    """The largest size in 1..`upper` with `peak_of(size) <= budget`, for a convex `peak_of`
    that grows with the size.

    0 when size 1 does not fit. Evaluates `peak_of` as few times as the curve allows: 1, then
    `upper` (a validation set smaller than what fits ends the search there), then points
    inside the bracket that the chord and the secant leave open; straight lines take three.
    With `upper_first`, `upper` is evaluated before 1: one evaluation instead of two when
    everything fits (a small validation set), one more when nothing does.
    """
    if upper < 1:
        raise ValueError(f"upper must be >= 1, got {upper}")
    peaks: dict[int, int] = {}

    def fits(size: int) -> bool:
        if size not in peaks:
            peaks[size] = peak_of(size)
        return peaks[size] <= budget

    if upper_first and fits(upper):
        return upper  # the peak grows with the size: every smaller size fits too
    if not fits(1):
        return 0
    if upper == 1 or fits(upper):
        return upper
    low, high = 1, upper  # `low` fits, `high` does not
    for _ in range(_MAX_SEARCH_STEPS):
        guess = _next_guess(peaks, low, high, budget)
        if guess <= low:
            break
        if fits(guess):
            low = guess
        else:
            high = guess
    return low


def _next_guess(peaks: dict[int, int], low: int, high: int, budget: int) -> int:
    """The next size to measure in (`low`, `high`), or `low` when the answer is `low`."""
    if high - low <= 1:
        return low
    # The chord from `low` to `high` lies above the convex curve: its crossing fits.
    span = peaks[high] - peaks[low]
    chord = low + math.floor((budget - peaks[low]) * (high - low) / span)
    certain = min(max(chord, low + 1), high - 1)
    fitting = sorted(size for size, value in peaks.items() if value <= budget)
    if len(fitting) < 2:
        return certain  # a second fitting size gives the secant
    # The secant through the two largest fitting sizes, extended, lies below the curve: its
    # crossing is at or beyond the answer.
    before, last = fitting[-2], fitting[-1]
    slope = (peaks[last] - peaks[before]) / (last - before)
    possible = high - 1
    if slope > 0:
        possible = min(possible, last + math.floor((budget - peaks[last]) / slope))
    if possible <= low:
        return low
    if certain >= possible:
        return possible
    # Between what surely fits and what possibly does, lean towards the sure side: a fit there
    # moves the secant into the curve's last stretch, where it becomes exact.
    return certain + max(1, (possible - certain) // 4)
