"""Run one training or validation step in micro-batches and redo what an OOM interrupted.

These runners are what :class:`~vramkit.core.oom.resilient_module.OOMResilientModule`
puts around a module's ``training_step`` and ``validation_step``. A step is a sequence of
attempts; each attempt runs the samples not done yet in micro-batches. After a failed attempt
the process decides alone (:func:`~vramkit.core.oom.policy.decide`) what to do about it; a
step without an OOM does nothing besides the module's own work, whatever the model's size:
no hook, no parameter walk, no tensor operation, no collective. The failed micro-batch's
tensors live only in the frames of :meth:`_StepRunner._micro_batch`, which the exception
took with it: memory is released after the ``except`` block, never inside it.
"""

from __future__ import annotations

import abc
import gc
import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import lightning as L
import torch
from lightning.pytorch.utilities.memory import is_oom_error

from vramkit.core.compat import lightning_private
from vramkit.core.distributed.rank_zero_logging import EVERY_PROCESS
from vramkit.core.oom.batch_split import slice_batch
from vramkit.core.oom.ddp_touch import touch_every_parameter
from vramkit.core.oom.give_up import give_up
from vramkit.core.oom.grad_arrivals import GradArrivals
from vramkit.core.oom.log_buffer import HeldCalls, LogBuffer
from vramkit.core.oom.policy import Action, decide
from vramkit.core.oom.recovery_state import GuardedModule, LossWeight, OOMRecoveryState

if TYPE_CHECKING:
    from vramkit.core.oom.guard_plan import GuardPlan

log = logging.getLogger(__name__)

LAST_RESORT_CHECKPOINT = "oom_last_resort.ckpt"
LOSS_TERMS = "loss_terms"  # key of a training step's output: its loss by unit of averaging


@dataclass
class _Segment:
    """Samples ``[start, stop)`` still to do; ``done`` holds, by id, the parameters whose
    gradient for these samples is already accumulated (an interrupted backward pass)."""

    start: int
    stop: int
    done: dict[int, torch.nn.Parameter] = field(default_factory=dict)


@dataclass
class _MicroResult:
    loss: torch.Tensor | None  # weighted, detached loss of the micro-batch (training)
    output: Any  # what the module's step returned, detached


def is_out_of_memory(error: BaseException) -> bool:
    """Whether ``error`` is an allocation failure: ``torch.cuda.OutOfMemoryError`` or what
    Lightning's batch-size finder also counts (cuDNN workspace, CPU allocator)."""
    return isinstance(error, torch.cuda.OutOfMemoryError) or is_oom_error(error)


def release_memory(device: torch.device) -> None:
    """Collect reference cycles and hand the CUDA cache's free blocks back to the driver."""
    gc.collect()
    if device.type == "cuda" and torch.cuda.is_available():
        torch.cuda.empty_cache()


class _StepRunner(abc.ABC):
    phase = ""  # "train" or "val"

    def __init__(
        self,
        module: GuardedModule,
        step: Callable[..., Any],
        batch: Any,
        samples: int,
        batch_idx: int,
        extra: tuple[Any, ...],
    ) -> None:
        self.module = module
        self.state = module.oom_state
        self.trainer: L.Trainer = module.trainer
        self.step = step
        self.batch = batch
        self.samples = samples
        self.batch_idx = batch_idx
        self.extra = extra
        self.logs = LogBuffer()
        self.results: list[_MicroResult] = []

    def _attempts(self, whole_batch_failed: bool = False) -> bool:
        """Run the step's samples until all are done; False when this process gave up.
        ``whole_batch_failed``: the whole batch was just tried and ran out of memory
        (:func:`train_whole_batch`), with nothing of it accumulated."""
        segments = [_Segment(0, self.samples)]
        failures = 0
        while True:
            micro_batch = self._learned() or self.samples
            if whole_batch_failed:
                whole_batch_failed = False
            else:
                segments = self._attempt(segments, micro_batch)
            if not segments:
                return True
            decision = decide(micro_batch, failures, last_resort=self.phase == "train")
            failures += 1
            release_memory(self.module.device)
            if decision.action is Action.GIVE_UP:
                give_up(self.module, self._give_up_message(micro_batch))
                return False
            self._remember(decision.micro_batch)
            if decision.action is Action.LAST_RESORT:
                self._last_resort(decision.micro_batch)
            else:
                self._say_split(decision.micro_batch)

    # One attempt: the remaining segments in micro-batches, until done or out of memory.
    def _attempt(self, segments: list[_Segment], micro_batch: int) -> list[_Segment]:
        remaining = list(segments)
        while remaining:
            segment = remaining[0]
            stop = min(segment.start + micro_batch, segment.stop)
            result = self._try_micro_batch(segment.start, stop, segment.done)
            if result is None:
                left = [_Segment(segment.start, stop, self._interrupted(segment))]
                if stop < segment.stop:
                    left.append(_Segment(stop, segment.stop, segment.done))
                return left + remaining[1:]
            self.results.append(result)
            if stop < segment.stop:
                remaining[0] = _Segment(stop, segment.stop, segment.done)
            else:
                remaining.pop(0)
        return []

    def _try_micro_batch(
        self, start: int, stop: int, done: dict[int, torch.nn.Parameter]
    ) -> _MicroResult | None:
        failed = False
        self.logs.start(stop - start)
        self.state.log_buffer = self.logs
        try:
            result = self._micro_batch(start, stop, done)
        except RuntimeError as error:
            if not is_out_of_memory(error):
                raise
            # Only note it: the exception holds the failed micro-batch's frames, and with them
            # its activations, until this block ends.
            failed = True
        finally:
            self.state.log_buffer = None
        if failed:
            self.logs.drop()
            return None
        self.logs.commit()
        return result

    @abc.abstractmethod
    def _micro_batch(
        self, start: int, stop: int, done: dict[int, torch.nn.Parameter]
    ) -> _MicroResult:
        """Run samples ``start:stop`` of the batch; the subclass says how (train or validate)."""

    @abc.abstractmethod
    def _learned(self) -> int | None:
        """The micro-batch this phase has learned to use (samples); None: the whole batch."""

    @abc.abstractmethod
    def _remember(self, micro_batch: int) -> None:
        """Keep ``micro_batch`` samples for the rest of the run after a recovery."""

    def _interrupted(self, segment: _Segment) -> dict[int, torch.nn.Parameter]:
        """The parameters whose gradient for ``segment``'s failed micro-batch is already
        accumulated; a redo leaves them out."""
        return segment.done

    def _last_resort(self, micro_batch: int) -> None:
        """Only training has optimizer state to move out of the way."""
        raise NotImplementedError(f"no last resort in the {self.phase} phase")

    def _slice(self, start: int, stop: int) -> Any:
        if (start, stop) == (0, self.samples):
            return self.batch
        return slice_batch(self.batch, start, stop, self.samples)

    def _check_fault(self, size: int) -> None:
        check_fault(self.state, self.phase, size)

    def _where(self) -> str:
        rank = f"process {self.trainer.global_rank}, " if self.trainer.world_size > 1 else ""
        return (
            f"{self.phase} step of epoch {self.trainer.current_epoch}, batch {self.batch_idx} "
            f"({rank}{self.samples} samples)"
        )

    def _say(self, message: str, *args: Any) -> None:
        # Each process recovers alone, so each says what it did.
        log.warning(message, *args, extra=EVERY_PROCESS)

    @abc.abstractmethod
    def _say_split(self, micro_batch: int) -> None:
        """Say that the step is redone in micro-batches of ``micro_batch``."""

    def _give_up_message(self, micro_batch: int) -> str:
        where = (
            f" The last-resort checkpoint is {self.state.last_resort_checkpoint}."
            if self.state.last_resort_checkpoint
            else ""
        )
        return (
            f"out of memory in the {self._where()} with {micro_batch} sample per micro-batch: "
            f"nothing smaller is left to try.{where} Plan the run with "
            "`python scripts/plan_memory.py` and apply one of its remedies (gradient "
            "checkpointing, a lower precision, a smaller model or input size)."
        )


class TrainingStepRunner(_StepRunner):
    """A training step whose gradients are accumulated micro-batch by micro-batch.

    The gradients only need watching (:class:`GradArrivals`) while they hold something an
    interrupted backward pass must not spoil: earlier batches of an accumulation window, or an
    earlier micro-batch of this step. Otherwise a failed micro-batch's partial gradients are
    zeroed and it is simply redone, so a step that runs whole needs no hook at all.
    """

    phase = "train"

    def __init__(self, module: GuardedModule, plan: GuardPlan, *args: Any) -> None:
        super().__init__(module, *args)
        self.plan = plan
        self._batch_weight: LossWeight | None = None
        self._accumulate = self.trainer.accumulate_grad_batches
        self._window_start = self.batch_idx % self._accumulate == 0
        self._gradients_to_keep = not self._window_start
        self._watching = False  # the running micro-batch's gradient arrivals are noted
        self._arrivals = plan.arrivals
        self._own_arrivals: GradArrivals | None = None  # installed for this step only

    def run(self, whole_batch_failed: bool = False) -> Any:
        """The step's output for Lightning. ``whole_batch_failed``: :func:`train_whole_batch`
        just ran out of memory on this batch (the step goes on from that failure)."""
        state = self.state
        state.skip_zero_grad = state.backward_done = False
        # Lightning zeroes the gradients after training_step returns (it runs the step first);
        # this step fills them itself, so it zeroes them first and Lightning's call is skipped.
        if self._window_start:
            zero_grads_now(self.module, self.batch_idx)
            state.skip_zero_grad = True
        try:
            completed = self._attempts(whole_batch_failed)
        finally:
            if self._own_arrivals is not None:
                self._own_arrivals.remove()
        if not completed:
            return idle_training_output(self.module, self.plan, self.batch_idx)
        self.logs.replay(lightning_log(self.module))
        if state.train_recoveries:
            self._report()
        return self._lightning_output()

    def _learned(self) -> int | None:
        return self.state.train_micro_batch

    def _remember(self, micro_batch: int) -> None:
        self.state.train_recoveries += 1
        self.state.train_micro_batch = micro_batch

    def _micro_batch(
        self, start: int, stop: int, done: dict[int, torch.nn.Parameter]
    ) -> _MicroResult:
        size = stop - start
        self._check_fault(size)
        self._watching = self._gradients_to_keep
        if self._watching:
            self._watch_arrivals()
        micro = self._slice(start, stop)
        if done:
            with GradArrivals.frozen(done.values()):
                return self._forward_backward(micro)
        return self._forward_backward(micro)

    def _watch_arrivals(self) -> None:
        if self._arrivals is None:
            self._own_arrivals = GradArrivals(self.plan.trainable)
            self._own_arrivals.install()
            self._arrivals = self._own_arrivals
        self._arrivals.reset()

    def _forward_backward(self, micro: Any) -> _MicroResult:
        module = self.module
        output = self.step(module, micro, self.batch_idx, *self.extra)
        loss, extras = _loss_and_extras(output)
        terms = extras.pop(LOSS_TERMS, None)
        if loss is None:
            return _MicroResult(None, None)
        share = loss if micro is self.batch else self._share_of_batch_loss(loss, terms, micro)
        if _backward(module, self.plan, share, self._accumulate):
            self._gradients_to_keep = True
        return _MicroResult(share.detach(), _detached(extras) if extras else None)

    def _interrupted(self, segment: _Segment) -> dict[int, torch.nn.Parameter]:
        if self._watching:
            return {**segment.done, **self._arrivals.arrived()}
        # Nothing was accumulated before this micro-batch: drop whatever its interrupted
        # backward pass added and redo it all.
        zero_grads_now(self.module, self.batch_idx)
        return {}

    def _share_of_batch_loss(
        self, loss: torch.Tensor, terms: Mapping[str, torch.Tensor] | None, micro: Any
    ) -> torch.Tensor:
        """The micro-batch's contribution to the whole batch's loss: each mean it averages
        weighted by the micro-batch's share of that mean's units."""
        module = self.module
        if self._batch_weight is None:
            self._batch_weight = module.micro_batch_weight(self.batch)
        weight, whole = module.micro_batch_weight(micro), self._batch_weight
        if not isinstance(weight, Mapping):
            return loss * _share(weight, whole, loss)
        if terms is None or set(terms) != set(weight):
            raise ValueError(
                f"{type(module).__name__}.micro_batch_weight counts the units of loss terms "
                f"{sorted(weight)}, so training_step must return them as "
                f"{{'loss': ..., '{LOSS_TERMS}': {{name: term}}}}; got "
                f"{None if terms is None else sorted(terms)}"
            )
        return sum(terms[name] * _share(weight[name], whole[name], loss) for name in weight)

    def _say_split(self, micro_batch: int) -> None:
        self._say(
            "Out of memory in the %s: redoing its unfinished samples in micro-batches "
            "of %d with gradient accumulation (%d per batch x accumulate_grad_batches "
            "%d; same effective batch) and keeping that micro-batch for the rest of "
            "the run.",
            self._where(),
            micro_batch,
            math.ceil(self.samples / micro_batch),
            self._accumulate,
        )

    def _last_resort(self, micro_batch: int) -> None:
        """Save a checkpoint and continue from it: the optimizer state is dropped from the
        device and loaded back from the file into freshly emptied memory."""
        module, trainer, state = self.module, self.trainer, self.state
        path = _last_resort_path(trainer)
        _save_checkpoint_here(trainer, path)
        for optimizer in trainer.optimizers:
            optimizer.state.clear()
        release_memory(module.device)
        # Read to host memory: the device holds no second copy while the state moves back.
        checkpoint = trainer.strategy.checkpoint_io.load_checkpoint(
            path, map_location="cpu", weights_only=True
        )
        trainer.strategy.load_optimizer_state_dict(checkpoint)
        del checkpoint
        state.last_resorts += 1
        state.last_resort_checkpoint = str(path)
        per_batch = math.ceil(self.samples / micro_batch)
        accumulate = self._accumulate * per_batch
        self._say(
            "Out of memory again in the %s: last resort taken. Saved %s, reloaded the optimizer "
            "state from it into emptied memory, and continuing with half the micro-batch (%d) "
            "and twice the accumulation (%d micro-batches per optimizer step). If the process "
            "dies anyway, resume with: ckpt_path=%s hw.batch_size=%d "
            "hw.accumulate_grad_batches=%d",
            self._where(),
            path,
            micro_batch,
            accumulate,
            path,
            micro_batch,
            accumulate,
        )

    def _report(self) -> None:
        state = self.state
        micro_batch = state.train_micro_batch or self.samples
        accumulation = math.ceil(self.samples / micro_batch) * self._accumulate
        metrics = {
            "oom/train_recoveries": (state.train_recoveries, "max"),
            "oom/train_micro_batch": (micro_batch, "min"),
            "oom/train_accumulation": (accumulation, "max"),
            "oom/last_resorts": (state.last_resorts, "max"),
        }
        for name, (value, reduce_fx) in metrics.items():
            self.module.log(
                name,
                float(value),
                on_step=False,
                on_epoch=True,
                reduce_fx=reduce_fx,
                batch_size=self.samples,
            )

    def _lightning_output(self) -> Any:
        losses = [r.loss for r in self.results if r.loss is not None]
        if not losses:
            return None
        self.state.backward_done = True
        value = losses[0] if len(losses) == 1 else torch.stack(losses).sum()
        value = _with_gradient_sync(value, self.plan)
        extras = next((r.output for r in reversed(self.results) if r.output), None)
        return {"loss": value, **extras} if extras else value


OUT_OF_MEMORY = object()  # what train_whole_batch returns after an OOM


def takes_whole_batch_first(module: GuardedModule, batch_idx: int) -> bool:
    """Whether this training step may first try :func:`train_whole_batch`: no micro-batch
    learned yet, and no gradients of earlier batches of an accumulation window to keep."""
    return (
        module.oom_state.train_micro_batch is None
        and batch_idx % lightning_private.attached_trainer(module).accumulate_grad_batches == 0
    )


def train_whole_batch(
    module: GuardedModule,
    plan: GuardPlan,
    step: Callable[..., Any],
    batch: Any,
    samples: int,
    batch_idx: int,
    extra: tuple[Any, ...],
) -> Any:
    """The usual training step: the whole batch, forward and backward, then its output for
    Lightning; :data:`OUT_OF_MEMORY` when it ran out of memory, with its partial gradients
    zeroed and its log calls dropped, for :class:`TrainingStepRunner` to go on from.

    The same work as the runner's first attempt at the whole batch, without its bookkeeping
    for segments and micro-batches: on ``benchmarks/step_overhead.py``'s tiny model that
    bookkeeping was about 340 Python bytecodes per step (of 37,800; opcode tracing).

    The gradients are zeroed where Lightning's own closure zeroes them: after the step's
    forward, before its backward (``Closure.closure`` in
    lightning/pytorch/loops/optimization/automatic.py), so the previous step's gradients are
    alive during the forward, as the planner counts them. Zeroing them before the forward
    instead changed the order of the host's frees: on a CPU run, glibc then handed the
    heap's top back to the kernel before the forward and faulted it in again, a median 30k
    page faults a DBNet step against the plain loop's 8k, 50 ms of a 700 ms step
    (``benchmarks/overhead.py``'s default task, four runs of each).
    """
    state = module.oom_state
    state.skip_zero_grad = state.backward_done = False
    logs = HeldCalls()
    state.log_buffer = logs
    failed = False
    try:
        check_fault(state, "train", samples)
        output = step(module, batch, batch_idx, *extra)
        loss, extras = _loss_and_extras(output)
        zero_grads_now(module, batch_idx)
        state.skip_zero_grad = True  # Lightning's own call after this step would zero again
        if loss is not None:
            _backward(
                module,
                plan,
                loss,
                lightning_private.attached_trainer(module).accumulate_grad_batches,
            )
    except RuntimeError as error:
        if not is_out_of_memory(error):
            raise
        failed = True  # memory is released once this frame is gone, see the module docstring
    finally:
        state.log_buffer = None
    if failed:
        # Out of memory in the forward leaves the previous step's gradients, in the backward
        # this batch's partial ones: the runner starts from none.
        zero_grads_now(module, batch_idx)
        return OUT_OF_MEMORY
    logs.replay(lightning_log(module))
    if loss is None:
        return None
    state.backward_done = True
    value = _with_gradient_sync(loss.detach(), plan)
    extras.pop(LOSS_TERMS, None)
    return {"loss": value, **_detached(extras)} if extras else value


def lightning_log(module: GuardedModule) -> Callable[..., None]:
    """Lightning's own ``log`` of ``module``, where held-back calls go: a subclass's override
    of ``log`` ran when the call was recorded, and must not run again for the replay."""
    return L.LightningModule.log.__get__(module)


def check_fault(state: OOMRecoveryState, phase: str, size: int) -> None:
    """Raise the OOM that ``fault.oom_<phase>_above`` injects for a micro-batch of ``size``
    samples."""
    limit = state.fault_above[phase]
    if limit is not None and size > limit:
        raise torch.cuda.OutOfMemoryError(
            f"injected by fault.oom_{phase}_above={limit}: a {phase} micro-batch of {size} samples"
        )


def zero_grads_now(module: GuardedModule, batch_idx: int) -> None:
    """Zero the gradients through the module's ``optimizer_zero_grad`` (a user's override
    included), even while Lightning's own call after the step is to be skipped."""
    state, trainer = module.oom_state, lightning_private.attached_trainer(module)
    skip, state.skip_zero_grad = state.skip_zero_grad, False
    module.optimizer_zero_grad(trainer.current_epoch, batch_idx, trainer.optimizers[0])
    state.skip_zero_grad = skip


def _backward(module: GuardedModule, plan: GuardPlan, loss: torch.Tensor, accumulate: int) -> bool:
    """The backward pass Lightning would run on ``loss``; False when ``loss`` has no graph."""
    # Lightning divides the returned loss by accumulate_grad_batches before its own backward
    # pass; this one must do the same.
    scaled = loss / accumulate if accumulate > 1 else loss
    if not scaled.requires_grad:
        return False
    if plan.scaler is not None:
        scaled = plan.scaler.scale(scaled)
    if plan.autocast:
        # Backward passes run outside autocast, as in Lightning's own loop.
        with torch.autocast(module.device.type, enabled=False):
            module.backward(scaled)
    else:
        module.backward(scaled)
    return True


def idle_training_output(module: GuardedModule, plan: GuardPlan, batch_idx: int) -> Any:
    """The output of a training step that does no work (its process gave up and waits for the
    others, see :mod:`vramkit.core.oom.give_up`): zero gradients, a zero loss, and under DDP
    the gradient all-reduce the other processes start."""
    zero_grads_now(module, batch_idx)
    module.oom_state.backward_done = True
    return _with_gradient_sync(torch.zeros((), device=module.device), plan)


def _with_gradient_sync(value: torch.Tensor, plan: GuardPlan) -> torch.Tensor:
    """``value`` with, when DDP all-reduces gradients after this step, the zero that starts it
    (the step's gradients were accumulated inside DDP's forward, where the reducer ignores
    them). Between the batches of an accumulation window Lightning turns the sync off."""
    if plan.ddp is not None and plan.ddp.require_backward_grad_sync:
        return value + touch_every_parameter(plan.trainable)
    return value


class ValidationStepRunner(_StepRunner):
    """A validation step run in micro-batches of the size validation has learned to fit."""

    phase = "val"

    def run(self) -> Any:
        state = self.state
        if not self._attempts():
            return None
        self.logs.replay(lightning_log(self.module))
        if state.val_recoveries:
            for name, value, reduce_fx in (
                ("oom/val_recoveries", state.val_recoveries, "max"),
                ("oom/val_micro_batch", state.val_micro_batch or self.samples, "min"),
            ):
                self.module.log(name, float(value), reduce_fx=reduce_fx, batch_size=self.samples)
        # Lightning keeps no validation outputs; callbacks see the last micro-batch's.
        return self.results[-1].output if self.results else None

    def _learned(self) -> int | None:
        return self.state.val_micro_batch

    def _remember(self, micro_batch: int) -> None:
        self.state.val_recoveries += 1
        self.state.val_micro_batch = micro_batch

    def _micro_batch(
        self, start: int, stop: int, done: dict[int, torch.nn.Parameter]
    ) -> _MicroResult:
        self._check_fault(stop - start)
        output = self.step(self.module, self._slice(start, stop), self.batch_idx, *self.extra)
        return _MicroResult(None, output)

    def _say_split(self, micro_batch: int) -> None:
        self._say(
            "Out of memory in the %s: running it in micro-batches of %d (the same metrics) "
            "and keeping that validation micro-batch for the rest of the run.",
            self._where(),
            micro_batch,
        )


def _last_resort_path(trainer: L.Trainer) -> Path:
    folder = getattr(trainer.checkpoint_callback, "dirpath", None) or (
        Path(trainer.default_root_dir) / "checkpoints"
    )
    name = LAST_RESORT_CHECKPOINT
    if trainer.global_rank:
        # Each process takes its last resort alone; DDP replicas hold the same state.
        name = name.replace(".ckpt", f".rank{trainer.global_rank}.ckpt")
    return Path(folder) / name


def _save_checkpoint_here(trainer: L.Trainer, path: Path) -> None:
    """What ``Trainer.save_checkpoint`` writes (optimizer state included), written by this
    process alone: ``save_checkpoint`` also waits at a barrier for every process, which a
    process recovering alone would never leave."""
    checkpoint = lightning_private.dump_checkpoint(trainer, weights_only=False)
    trainer.strategy.checkpoint_io.save_checkpoint(checkpoint, path)


def _loss_and_extras(output: Any) -> tuple[torch.Tensor | None, dict[str, Any]]:
    if output is None:
        return None, {}
    if isinstance(output, torch.Tensor):
        return output, {}
    if isinstance(output, Mapping) and "loss" in output:
        return output["loss"], {k: v for k, v in output.items() if k != "loss"}
    raise TypeError(
        "training_step must return a loss tensor, a dict with a 'loss' key, or None; "
        f"got {type(output).__name__}"
    )


def _share(part: Any, whole: Any, like: torch.Tensor) -> torch.Tensor:
    """``part / whole`` as a 0-d tensor on ``like``'s device, 0 when ``whole`` is 0. Counts
    given as tensors stay on their device (no host synchronisation). At least float32, so a
    half-precision loss does not round its share; float64 for a float64 loss."""
    dtype = torch.promote_types(like.dtype, torch.float32)
    part = torch.as_tensor(part, dtype=dtype, device=like.device)
    whole = torch.as_tensor(whole, dtype=dtype, device=like.device)
    return torch.where(whole > 0, part / whole, 0.0)


def without_loss_terms(output: Any) -> Any:
    """A training step's output without its ``"loss_terms"``, which only a split step reads."""
    if isinstance(output, Mapping) and LOSS_TERMS in output:
        return {key: value for key, value in output.items() if key != LOSS_TERMS}
    return output


def _detached(extras: dict[str, Any]) -> dict[str, Any]:
    return {k: v.detach() if isinstance(v, torch.Tensor) else v for k, v in extras.items()}
