"""Trace Lightning's training and validation steps and measure live device memory.

`trace_training` replays what Lightning's automatic optimization does for each batch:
`training_step` inside the precision's autocast block (the previous step's gradients are still
alive: Lightning zeroes them only after the next forward), the module's `optimizer_zero_grad`
hook (Lightning's own sets the gradients to None; an override may keep them) on the first batch
of an accumulation window, `backward` of the loss divided by the accumulation (and
multiplied by the loss scale under `16-mixed`), and `optimizer.step()` at the end of the window.
Two optimizer steps run, because the optimizer creates its state in the first one.

`trace_validation` reproduces validation inside `fit`: parameters, the last step's gradients and
the optimizer state are resident (Lightning does not free them between the phases), and
`validation_step` runs in eval mode under `no_grad` inside the autocast block. The device part is
what is measured; host post-processing (`.numpy()`, `.tolist()`) receives zero arrays of the
right shape and dtype, so it runs, on empty outputs, without touching fake data.

`trace_inference` is evaluation on its own (`eval.py`, `Trainer.validate`): only the parameters
and buffers are resident, and `validation_step` runs in eval mode without grad inside the autocast
block (see its docstring for why `no_grad` stands for Lightning's `torch.inference_mode`).

Both work on real tensors too (no fake mode active), which is how the trace is checked against
a real CPU run. `cuda_semantics` adds the CUDA rules for a fake trace of a GPU run.
"""

from __future__ import annotations

import contextlib
import logging
import os
import warnings
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import lightning as L
import numpy as np
import torch
from torch._subclasses.fake_tensor import (
    DataDependentOutputException,
    DynamicOutputShapeException,
    FakeTensor,
)
from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.overrides import TorchFunctionMode
from torch.utils._mode_utils import no_dispatch
from torch.utils._pytree import tree_flatten

from vramkit.core.planner.cuda.attention_rules import CudaAttention
from vramkit.core.planner.cuda.autocast_rules import CudaAutocast
from vramkit.core.planner.cuda.cuda_rules import (
    GRAD_SCALER_INIT_SCALE,
    autocast_dtype,
    round_allocation,
)
from vramkit.core.planner.cuda.dropout_rules import CudaDropout
from vramkit.core.planner.cuda.fast_paths import InferenceFastPaths
from vramkit.core.planner.cuda.op_rules import (
    CUDNN_CONVOLUTIONS,
    CudaKernels,
    convolution_workspace_bytes,
)
from vramkit.core.planner.cuda.optimizer_layouts import ZeroStage2Layout, host_state_tensors
from vramkit.core.planner.errors import PlanningError
from vramkit.core.planner.shortcuts.convolution_outputs import convolution_output
from vramkit.core.planner.shortcuts.elementwise_outputs import elementwise_output
from vramkit.core.planner.shortcuts.fake_constants import lifted_constant
from vramkit.core.planner.shortcuts.fake_views import fake_view, takes_fast_view
from vramkit.core.planner.shortcuts.fresh_outputs import fresh_output
from vramkit.core.planner.shortcuts.in_place_writes import writes_values_only, written_result
from vramkit.core.planner.shortcuts.output_memo import OutputMemo
from vramkit.core.planner.shortcuts.shape_rules import FALL_BACK, direct_outputs
from vramkit.core.planner.tracing.peak_holders import Holder
from vramkit.core.planner.tracing.recorder import (
    GRADIENTS,
    INPUTS,
    OPTIMIZER_STATE,
    PARAMETERS,
    StorageRecorder,
)
from vramkit.core.planner.tracing.run_setup import RunSetup
from vramkit.core.planner.tracing.subject import trainable_parameters

_NOT_ATTACHED = "self.trainer` reference is not registered"
OPTIMIZER_STEP = "optimizer step"
"""The phase name of `optimizer.step()` in a training trace's labels ("step 2: optimizer step")."""
# Ops that draw random numbers (aten names without overload).
_ITEM = torch.ops.aten._local_scalar_dense.default
"""Reading a scalar tensor's value on the host (`.item()`, `float(t)`, `if t:`)."""
_UNSCALE = torch.ops.aten._amp_foreach_non_finite_check_and_unscale_.default
"""GradScaler's unscale and inf check (fills its `found_inf` argument in place)."""
_UNIT_INTERVAL_OPS = frozenset({"rand", "rand_like"})
"""Random ops whose draws lie in [0, 1) (`torch.rand`)."""
_COMPARISONS = frozenset({"lt", "le", "gt", "ge"})
_RANDOM_OPS = frozenset(
    {
        "rand",
        "rand_like",
        "randn",
        "randn_like",
        "randint",
        "randint_like",
        "random_",
        "uniform",
        "uniform_",
        "normal",
        "normal_",
        "bernoulli",
        "bernoulli_",
        "multinomial",
        "exponential_",
    }
)


@dataclass(frozen=True)
class StepTrace:
    """What a traced phase allocated: its peak, what was live then, and how it got there."""

    peak_bytes: int
    breakdown: dict[str, int]
    """Bytes live at the peak by recorder category (parameters, gradients, …)."""
    peak_at: str
    """When the peak happened, e.g. "step 2: forward"."""
    attention_kernels: tuple[str, ...]
    """The SDPA kernel each attention call would run on the target GPU."""
    timeline: tuple[int, ...]
    """Live bytes after every op that changed them (empty unless asked for)."""
    holders: tuple[Holder, ...] = ()
    """The largest groups of tensors live at the peak, by module and kind."""
    events: tuple[tuple[int, int], ...] = ()
    """Every allocation (serial, bytes) and free (serial, 0) of the phase, in order."""
    max_allocated_bytes: int = 0
    """The peak with the cuDNN workspace each convolution takes when memory is to spare."""
    max_allocated_holders: tuple[Holder, ...] = ()
    """What is live at that moment (`holders` when no workspace rises above the peak)."""
    max_allocated_breakdown: dict[str, int] = field(default_factory=dict)
    """Bytes live at that moment by recorder category, the workspace under `WORKSPACE`."""


class StepSemantics:
    """How a run's steps differ by precision: the autocast block and the loss scale."""

    def __init__(self, setup: RunSetup, autocast: CudaAutocast | None) -> None:
        self.setup = setup
        self.autocast = autocast
        lower = autocast_dtype(setup.precision)
        self.loss_scale = GRAD_SCALER_INIT_SCALE if lower == torch.float16 else 1.0

    def forward_region(self) -> contextlib.AbstractContextManager:
        """Lightning's `precision.forward_context()` for this run."""
        return self.autocast.region() if self.autocast is not None else contextlib.nullcontext()

    def saved_tensors(self) -> contextlib.AbstractContextManager:
        """Where a training forward's saved tensors live: on the device, or offloaded to the host
        as `torch.autograd.graph.save_on_cpu` does (`offloaded_saves`)."""
        if self.setup.activation_offload:
            return offloaded_saves()
        return contextlib.nullcontext()

    def inference_fast_paths(self, module: torch.nn.Module) -> contextlib.AbstractContextManager:
        """The GPU's inference fast path of `module`'s attention, for a validation step.

        Only with a target GPU: a CPU run's own fast path is what a real CPU trace records.
        """
        if self.setup.device is None:
            return contextlib.nullcontext()
        autocast = autocast_dtype(self.setup.precision) is not None
        return InferenceFastPaths(module, self.setup.device, autocast=autocast)


def offloaded_saves() -> contextlib.AbstractContextManager:
    """`save_on_cpu` as device memory sees it (torch/autograd/graph.py): packing keeps a host
    copy, so the device tensor is freed once nothing else holds it (parameters stay); unpacking
    in backward allocates a device copy that lives while its backward node runs. The host copy
    is not device memory, so the trace keeps only its shape."""

    def pack(tensor: torch.Tensor) -> tuple:
        return tensor.size(), tensor.stride(), tensor.dtype, tensor.device

    def unpack(saved: tuple) -> torch.Tensor:
        size, stride, dtype, device = saved
        return torch.empty_strided(size, stride, dtype=dtype, device=device)

    return torch.autograd.graph.saved_tensors_hooks(pack, unpack)


@contextlib.contextmanager
def cuda_semantics(setup: RunSetup) -> Iterator[tuple[StepSemantics, CudaAttention | None]]:
    """The CUDA rules of `setup` for CPU tensors, while inside: autocast, attention kernels and
    fused dropout.

    Without a target device (CPU planning) nothing changes.
    """
    with contextlib.ExitStack() as stack:
        autocast = None
        attention = None
        if setup.device is not None:
            lower = autocast_dtype(setup.precision)
            if lower is not None:
                autocast = stack.enter_context(CudaAutocast(lower))
            attention = stack.enter_context(CudaAttention(setup.device))
            stack.enter_context(CudaDropout())
            stack.enter_context(CudaKernels())
        yield StepSemantics(setup, autocast), attention


class FakeStepRecorder(StorageRecorder):
    """A recorder for fake tensors: device rounding, and stand-ins for data-dependent ops.

    A fake tensor has no values, so reading one (`.item()`, `int(t)`, `if t:`) yields a stand-in:
    True for a boolean, `scalar_stand_in` for a number (the largest element count in the batch,
    so a count that sizes a buffer, e.g. hard-negative mining's top-k, plans its worst case).
    Ops whose output size depends on values (`nonzero`, `masked_select`) plan the largest size.

    A branch on a random draw has no worst case a stand-in could know: LayerDrop
    (`if torch.rand([]) < layerdrop: skip the layer`, 0.1 by default in Wav2Vec2 / HuBERT) read
    as True skipped every layer, and planned peaks came out 42-81% low. So reading a scalar that
    derives from a random op stops the plan with a `PlanningError` saying what to set instead.
    A comparison whose answer the draw's range decides is answered: `torch.rand([]) < 0.0` is
    False for every draw in [0, 1), so LayerDrop at probability 0 (transformers 4.x OPT draws
    even then) plans every layer.

    With `cuda_run` (a GPU run is planned; by default whenever `round_to_device`) the recorder
    also follows two CUDA facts a CPU trace lacks: each convolution holds cuDNN's workspace
    while it runs (`op_rules.convolution_workspace_bytes`, counted after its outputs in
    `peak_with_workspaces`, see `charge_workspace`), and the step counters a `foreach` /
    for-loop Adam(W) keeps on the host (`optimizer_layouts.host_state_tensors`) leave device
    memory after every optimizer step.

    Ops the fake mode would answer are remade from `output_memo` when met before (pass one memo
    to every trace of a plan: the same layers recur across traces).
    """

    def __init__(
        self,
        *,
        scalar_stand_in: int,
        round_to_device: bool,
        keep_timeline: bool,
        cuda_run: bool | None = None,
        output_memo: OutputMemo | None = None,
    ) -> None:
        super().__init__(
            round_bytes=round_allocation if round_to_device else (lambda n: n),
            keep_timeline=keep_timeline,
        )
        self.scalar_stand_in = scalar_stand_in
        self.cuda_run = round_to_device if cuda_run is None else cuda_run
        self.output_memo = OutputMemo() if output_memo is None else output_memo
        self._optimizer_hook: Any = None
        # Scalars drawn at random, or computed from such draws: id → weak reference.
        self._random_scalars: dict[int, weakref.ref] = {}
        # Draws known to lie in [0, 1), and the answers of comparisons their range settles
        # (by id, with a weak reference: tensors compare elementwise, so they cannot be keys).
        self._unit_draws: dict[int, weakref.ref] = {}
        self._settled: dict[int, tuple[weakref.ref, bool]] = {}

    def __enter__(self) -> FakeStepRecorder:
        if self.cuda_run:
            # Global, so optimizers built before the trace (and wrapped ones) are seen too.
            self._optimizer_hook = register_optimizer_step_post_hook(self._after_optimizer_step)
        return super().__enter__()

    def __exit__(self, *exc: object) -> None:
        if self._optimizer_hook is not None:
            self._optimizer_hook.remove()
            self._optimizer_hook = None
        return super().__exit__(*exc)

    def _after_optimizer_step(self, optimizer: torch.optim.Optimizer, *_: object) -> None:
        self.leave_out(host_state_tensors(optimizer))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = super().__torch_dispatch__(func, types, args, kwargs)
        convolution = CUDNN_CONVOLUTIONS.get(func) if self.cuda_run else None
        if convolution is not None:
            # After the outputs: cuDNN writes into them while its workspace is held.
            self.charge_workspace(convolution_workspace_bytes(convolution, args, os.environ))
        return out

    def run_op(self, func: Any, args: tuple, kwargs: dict) -> Any:
        """Run one op on fake tensors; data-dependent results get the stand-ins above."""
        settled = self._settled.get(id(args[0])) if args else None
        if func is _ITEM and settled is not None:
            reference, answer = settled
            if reference() is args[0]:
                return answer
        if func is _ITEM and self._is_random(args[0]):
            raise PlanningError(
                "the step branches on a random draw (e.g. LayerDrop: `if torch.rand([]) < p`), "
                "whose worst case the planner cannot know; plan with that probability at 0 "
                "(every layer runs, e.g. model.config.layerdrop=0)"
            )
        out = self._run_fake(func, args, kwargs)
        if func is _UNSCALE and len(args) > 1:
            # GradScaler's inf check on a step worth planning finds nothing: the run steps the
            # optimizer (a stand-in would read as "inf found" and skip it).
            found_inf = args[1]
            self._settled[id(found_inf)] = (weakref.ref(found_inf), 0.0)
        if isinstance(out, torch.Tensor) and out.numel() <= 1:
            name = func.__name__.split(".")[0]
            settled = self._settled_comparison(name, args)
            if settled is not None:
                self._settled[id(out)] = (weakref.ref(out), settled)
                return out
            inputs = tree_flatten((args, kwargs))[0]
            if name in _RANDOM_OPS or any(self._is_random(value) for value in inputs):
                self._random_scalars[id(out)] = weakref.ref(out)
                if name in _UNIT_INTERVAL_OPS:
                    self._unit_draws[id(out)] = weakref.ref(out)
        return out

    def _settled_comparison(self, name: str, args: tuple) -> bool | None:
        """The answer of `draw <op> number` when every draw in [0, 1) gives the same one."""
        if name not in _COMPARISONS or len(args) != 2 or not isinstance(args[1], (int, float)):
            return None
        draw = args[0]
        reference = self._unit_draws.get(id(draw))
        if reference is None or reference() is not draw:
            return None
        threshold = float(args[1])
        always_below = threshold >= 1.0  # every draw is < 1
        never_below = threshold <= 0.0  # no draw is < 0; a draw of exactly 0 is not < 0
        if name == "lt":
            return True if always_below else False if never_below else None
        if name == "ge":
            return False if always_below else True if never_below else None
        if name == "le":
            return True if always_below else False if threshold < 0.0 else None
        return False if always_below else True if threshold < 0.0 else None  # gt

    def _is_random(self, value: Any) -> bool:
        if not self._random_scalars or not isinstance(value, torch.Tensor):
            return False
        reference = self._random_scalars.get(id(value))
        return reference is not None and reference() is value

    def _run_fake(self, func: Any, args: tuple, kwargs: dict) -> Any:
        if writes_values_only(func, args, kwargs):
            return written_result(func, args)
        if takes_fast_view(func, args, kwargs):
            return fake_view(func, args)
        fresh = fresh_output(func, args, kwargs)
        if fresh is None:
            fresh = elementwise_output(func, args, kwargs)
        if fresh is None:
            fresh = lifted_constant(func, args, kwargs)
        if fresh is not None:
            return fresh
        if func is _ITEM and type(args[0]) is FakeTensor and args[0].constant is not None:
            # A fake constant (Adam's step counters, read for the bias correction of every
            # parameter at every step) has its value: the fake mode's constant propagation reads
            # the same number, after a full dispatch (0.17 ms each, ~1,200 per default plan).
            with no_dispatch():
                return func(args[0].constant)
        out = direct_outputs(func, args, kwargs)  # shape_rules: no decomposition to run
        if out is not FALL_BACK:
            return out
        try:
            return self.output_memo.run(func, args, kwargs, lambda: _dispatched(func, args, kwargs))
        except DataDependentOutputException:
            if func is not _ITEM:
                raise
            value = args[0]
            if value.dtype == torch.bool:
                return True
            if value.is_floating_point():
                return float(self.scalar_stand_in)
            return self.scalar_stand_in
        except DynamicOutputShapeException:
            return self._largest_output(func, args)

    @staticmethod
    def _largest_output(func: Any, args: tuple) -> torch.Tensor:
        name = func.__name__.split(".")[0]
        source = args[0]
        if name == "nonzero":
            return torch.empty((source.numel(), source.dim()), dtype=torch.long)
        if name == "masked_select":
            shape = torch.broadcast_shapes(source.shape, args[1].shape)
            return torch.empty((int(np.prod(shape)),), dtype=source.dtype)
        raise PlanningError(
            f"aten.{func.__name__} has an output size that depends on tensor values, which the "
            "planner cannot know without data"
        )


def _dispatched(func: Any, args: tuple, kwargs: dict) -> Any:
    """The fake mode's outputs: from its own steps for a 2-D convolution, taken directly
    (`convolution_output`), else from its dispatch."""
    out = convolution_output(func, args, kwargs)
    return func(*args, **kwargs) if out is None else out


class HostTransfers(TorchFunctionMode):
    """`.numpy()`, `np.asarray(t)` and `.tolist()` of fake tensors give zeros of their shape."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in (torch.Tensor.numpy, torch.Tensor.__array__, torch.Tensor.tolist) and (
            isinstance(args[0], FakeTensor)
        ):
            zeros = np.zeros(tuple(args[0].shape), dtype=_numpy_dtype(args[0].dtype))
            return zeros.tolist() if func is torch.Tensor.tolist else zeros
        return func(*args, **kwargs)


_NUMPY_DTYPES = {
    torch.float64: np.float64,
    torch.float32: np.float32,
    torch.float16: np.float16,
    torch.bfloat16: np.float32,  # numpy has no bfloat16; host code sees floats
    torch.int64: np.int64,
    torch.int32: np.int32,
    torch.int16: np.int16,
    torch.int8: np.int8,
    torch.uint8: np.uint8,
    torch.bool: np.bool_,
}


def _numpy_dtype(dtype: torch.dtype) -> np.dtype:
    return np.dtype(_NUMPY_DTYPES.get(dtype, np.float32))


def batch_tensors(value: Any) -> list[torch.Tensor]:
    """Every tensor inside a (nested) batch."""
    return [v for v in tree_flatten(value)[0] if isinstance(v, torch.Tensor)]


def _loss_of(output: Any, step: int) -> torch.Tensor:
    loss = output.get("loss") if isinstance(output, dict) else output
    if not isinstance(loss, torch.Tensor):
        raise PlanningError(
            f"training_step returned {type(output).__name__} for planning batch {step}; the "
            "planner needs the loss tensor (or a dict with 'loss')"
        )
    return loss


@contextlib.contextmanager
def _quiet_logging() -> Iterator[None]:
    # The steps run without a Trainer: Lightning warns that self.log() has nowhere to go, and
    # modules may warn that Trainer-only features are off. Neither concerns the plan.
    disabled = logging.root.manager.disable
    logging.disable(logging.WARNING)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=f".*{_NOT_ATTACHED}.*")
            yield
    finally:
        logging.disable(disabled)


def _gradient_hooks(
    module: L.LightningModule,
    optimizer: torch.optim.Optimizer,
    recorder: StorageRecorder,
) -> Callable[[], None]:
    sink = optimizer.sink_gradient if isinstance(optimizer, ZeroStage2Layout) else None

    def finished(param: torch.Tensor) -> None:
        recorder.register([param.grad], GRADIENTS, owners=[param])
        if sink is not None:
            sink(param)
            recorder.register(optimizer.device_gradients(), GRADIENTS)

    handles = [p.register_post_accumulate_grad_hook(finished) for p in trainable_parameters(module)]
    return lambda: [handle.remove() for handle in handles]


def _register_state(
    module: L.LightningModule, optimizer: torch.optim.Optimizer, recorder: StorageRecorder
) -> None:
    recorder.register([*module.parameters(), *module.buffers()], PARAMETERS)
    parameters = list(module.parameters())
    recorder.register([p.grad for p in parameters], GRADIENTS, owners=parameters)
    _register_optimizer_state(optimizer, recorder)
    if isinstance(optimizer, ZeroStage2Layout):
        recorder.register(optimizer.device_gradients(), GRADIENTS)


def _register_optimizer_state(optimizer: torch.optim.Optimizer, recorder: StorageRecorder) -> None:
    # A GPU plan's recorder has left the host step counters out after the step (FakeStepRecorder);
    # registering them again counts nothing.
    owners, tensors = [], []
    for param, state in optimizer.state.items():
        for value in state.values():
            if isinstance(value, torch.Tensor):
                owners.append(param)
                tensors.append(value)
    recorder.register(tensors, OPTIMIZER_STATE, owners=owners)


def step_result(recorder: StorageRecorder, attention: CudaAttention | None = None) -> StepTrace:
    """What `recorder` saw of a phase, as a `StepTrace` (the kernels `attention` chose)."""
    holders = recorder.peak_holders()
    with_workspaces = recorder.peak_with_workspaces
    return StepTrace(
        peak_bytes=recorder.peak.bytes,
        breakdown=recorder.peak_breakdown(),
        peak_at=recorder.peak.label,
        attention_kernels=tuple(attention.choices) if attention is not None else (),
        timeline=tuple(recorder.timeline),
        holders=holders,
        events=tuple(recorder.events),
        max_allocated_bytes=with_workspaces.bytes,
        max_allocated_breakdown=recorder.peak_breakdown(with_workspaces=True),
        max_allocated_holders=(
            holders
            if with_workspaces is recorder.peak
            else recorder.peak_holders(with_workspaces=True)
        ),
    )


def _zero_grad_hook(
    module: L.LightningModule, optimizer: torch.optim.Optimizer
) -> Callable[[int], None]:
    """What zeroes the gradients before the backward of batch `batch_idx`: the module's
    `optimizer_zero_grad(current_epoch, batch_idx, optimizer)`, as Lightning calls it
    (loops/optimization/automatic.py, `_make_zero_grad_fn`); an override may keep the gradients
    (`set_to_none=False`) through the backward pass. A module without Lightning's hooks zeroes
    as Lightning's default hook does (`optimizer.zero_grad()`, which sets them to None)."""
    hook = getattr(module, "optimizer_zero_grad", None)
    if hook is None:
        return lambda _batch_idx: optimizer.zero_grad(set_to_none=True)
    return lambda batch_idx: hook(0, batch_idx, optimizer)  # the planned steps: epoch 0


def trace_training(
    module: L.LightningModule,
    optimizer: torch.optim.Optimizer,
    batch: Any,
    recorder: StorageRecorder,
    semantics: StepSemantics,
    *,
    optimizer_steps: int = 2,
    attention: CudaAttention | None = None,
) -> StepTrace:
    """Run `optimizer_steps` optimizer steps of Lightning's training loop on `batch`.

    With accumulation, every window runs two micro-batches (the second has the previous
    gradients alive through its backward pass, as all later ones do) before stepping.
    """
    accumulate = semantics.setup.accumulate_grad_batches
    micro_batches = min(accumulate, 2)
    zero_grad = _zero_grad_hook(module, optimizer)
    module.train()
    module.zero_grad(set_to_none=True)
    remove_hooks = _gradient_hooks(module, optimizer, recorder)
    try:
        with recorder, _quiet_logging(), recorder.attribute_to(module):
            _register_state(module, optimizer, recorder)
            recorder.register(batch_tensors(batch), INPUTS)
            for step in range(optimizer_steps):
                for micro in range(micro_batches):
                    index = step * accumulate + micro
                    with (
                        recorder.phase(f"step {step + 1}: forward"),
                        semantics.forward_region(),
                        semantics.saved_tensors(),
                    ):
                        loss = _loss_of(module.training_step(batch, index), index)
                    recorder.note_forward_end()
                    if micro == 0:
                        with recorder.phase(f"step {step + 1}: zero_grad"):
                            zero_grad(index)
                    with recorder.phase(f"step {step + 1}: backward"):
                        scaled = loss * (semantics.loss_scale / accumulate)
                        del loss
                        scaled.backward()
                        del scaled
                with recorder.phase(f"step {step + 1}: {OPTIMIZER_STEP}"):
                    optimizer.step()
                _register_optimizer_state(optimizer, recorder)
    finally:
        remove_hooks()
        recorder.close()
    return step_result(recorder, attention)


def prepare_resident_state(module: L.LightningModule, optimizer: torch.optim.Optimizer) -> None:
    """Give `module` the state it has after a training step: gradients and optimizer state."""
    module.train()
    with torch.no_grad():
        for param in trainable_parameters(module):
            param.grad = torch.zeros_like(param)
            if isinstance(optimizer, ZeroStage2Layout):
                optimizer.sink_gradient(param)
        optimizer.step()


def trace_validation(
    module: L.LightningModule,
    optimizer: torch.optim.Optimizer,
    batch: Any,
    recorder: StorageRecorder,
    semantics: StepSemantics,
    *,
    attention: CudaAttention | None = None,
) -> StepTrace:
    """Run one `validation_step` on `batch` in the state validation has inside `fit`."""
    module.zero_grad(set_to_none=True)
    try:
        with recorder, _quiet_logging(), recorder.attribute_to(module):
            prepare_resident_state(module, optimizer)
            _register_state(module, optimizer, recorder)
            _evaluation_step(module, batch, recorder, semantics, "validation step")
    finally:
        module.train()
        recorder.close()
    return step_result(recorder, attention)


def trace_inference(
    module: L.LightningModule,
    batch: Any,
    recorder: StorageRecorder,
    semantics: StepSemantics,
    *,
    attention: CudaAttention | None = None,
    tied_loaded_twice: bool = False,
) -> StepTrace:
    """Run one `validation_step` on `batch` as `Trainer.validate` does outside `fit`: no
    gradients, no optimizer state, eval mode without grad.

    Lightning validates under `torch.inference_mode`, which allocates on the device exactly what
    `no_grad` does (it only skips version counters and view tracking, host-side). The trace uses
    `no_grad`: under `inference_mode` fake tensors skip the emulated CUDA autocast kernels of
    composite ops (`F.interpolate` stayed fp16, where CUDA autocast runs it in fp32), and the
    transformer fast paths test only `torch.is_grad_enabled()`.

    The parameters and buffers are registered one by one, as moving a module to the device
    allocates them, so the allocator replay (`overhead_bytes`) sees the segments the load leaves
    cached. With `tied_loaded_twice` the weights were loaded as transformers' `from_pretrained`
    loads them onto the device: a tied weight once per name, the extra copies freed when the
    weights are tied; their freed segments stay reserved.
    """
    module.zero_grad(set_to_none=True)
    try:
        with recorder, _quiet_logging(), recorder.attribute_to(module):
            recorder.register([*module.parameters(), *module.buffers()], PARAMETERS)
            if tied_loaded_twice:
                copies = [torch.empty_like(weight) for weight in tied_duplicates(module)]
                recorder.register(copies, PARAMETERS)
                del copies
            _evaluation_step(module, batch, recorder, semantics, "inference step")
    finally:
        module.train()
        recorder.close()
    return step_result(recorder, attention)


def _evaluation_step(
    module: L.LightningModule,
    batch: Any,
    recorder: StorageRecorder,
    semantics: StepSemantics,
    phase: str,
) -> None:
    """`module.validation_step` on `batch` in eval mode without grad, its peak counted from the
    state already registered; the caller puts the module back in training mode."""
    recorder.register(batch_tensors(batch), INPUTS)
    recorder.reset_peak()
    module.eval()
    with (
        HostTransfers(),
        torch.no_grad(),
        recorder.phase(phase),
        semantics.forward_region(),
        semantics.inference_fast_paths(module),
    ):
        module.validation_step(batch, 0)


def tied_duplicates(module: torch.nn.Module) -> list[torch.nn.Parameter]:
    """Each parameter once for every name it has beyond its first (tied weights)."""
    seen: set[int] = set()
    duplicates = []
    for _, parameter in module.named_parameters(remove_duplicate=False):
        if id(parameter) in seen:
            duplicates.append(parameter)
        seen.add(id(parameter))
    return duplicates
