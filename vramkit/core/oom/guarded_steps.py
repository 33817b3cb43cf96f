"""Run one training or validation step in micro-batches and redo what an OOM interrupted.

These runners are what :class:`~vramkit.core.oom.resilient_module.OOMResilientModule`
puts around a module's ``training_step`` and ``validation_step``. A step is a sequence of
attempts; each attempt runs the samples not done yet in micro-batches, and after each attempt
every process agrees (:func:`~vramkit.core.oom.policy.decide`) whether one of them
ran out of memory and what to do about it. The failed micro-batch's tensors live only in the
frames of :meth:`_StepRunner._micro_batch`, which the exception took with it: memory is
released after the ``except`` block, never inside it.
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

import torch
from lightning.pytorch.strategies import DDPStrategy, DeepSpeedStrategy, SingleDeviceStrategy
from lightning.pytorch.utilities.memory import is_oom_error

from vramkit.core.oom.batch_split import slice_batch
from vramkit.core.oom.grad_arrivals import GradArrivals
from vramkit.core.oom.log_buffer import LogBuffer
from vramkit.core.oom.policy import Action, Decision, decide

if TYPE_CHECKING:
    import lightning as L

    from vramkit.core.oom.resilient_module import OOMResilientModule

log = logging.getLogger(__name__)

LAST_RESORT_CHECKPOINT = "oom_last_resort.ckpt"
LOSS_TERMS = "loss_terms"  # key of a training step's output: its loss by unit of averaging

# What OOMResilientModule.micro_batch_weight returns: one count (a number or a 0-d tensor), or
# one per loss term, by name.
LossWeight = float | torch.Tensor | Mapping[str, float | torch.Tensor]


@dataclass
class OOMRecoveryState:
    """What a module learned from its out-of-memory errors, kept for the rest of the run."""

    train_micro_batch: int | None = None  # samples per training micro-batch; None: whole batch
    val_micro_batch: int | None = None  # samples per validation micro-batch; None: whole batch
    train_recoveries: int = 0  # training OOMs survived
    val_recoveries: int = 0  # validation OOMs survived
    last_resorts: int = 0  # times the last resort (checkpoint and reload) was taken
    last_resort_checkpoint: str | None = None  # the checkpoint the last resort wrote
    fault_above: dict[str, int | None] = field(default_factory=lambda: {"train": None, "val": None})
    # Hand-over to the Lightning hooks that run after training_step returns:
    skip_zero_grad: bool = False  # the step zeroed the gradients itself, before its backward
    backward_done: bool = False  # the step accumulated its gradients; Lightning's pass only syncs
    depth: int = 0  # > 0 inside a guarded step (a subclass calling super() is not guarded twice)


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


def training_guard_applies(module: OOMResilientModule) -> str | None:
    """Why training steps of ``module`` cannot be guarded in this run, or None when they can."""
    trainer = module._trainer
    if trainer is None:
        return "no Trainer is attached"
    if not module.automatic_optimization:
        return "the module uses manual optimization"
    strategy = trainer.strategy
    supported = isinstance(strategy, (SingleDeviceStrategy, DDPStrategy)) and not isinstance(
        strategy, DeepSpeedStrategy
    )
    if not supported or strategy.handles_gradient_accumulation:
        return f"strategy {type(strategy).__name__} runs its own backward pass"
    return None


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
        module: OOMResilientModule,
        step: Callable[..., Any],
        batch: Any,
        samples: int,
        batch_idx: int,
        extra: tuple[Any, ...],
    ) -> None:
        self.module = module
        self.trainer: L.Trainer = module.trainer
        self.step = step
        self.batch = batch
        self.samples = samples
        self.batch_idx = batch_idx
        self.extra = extra
        self.logs = LogBuffer()
        self.results: list[_MicroResult] = []
        self._batch_weight: LossWeight | None = None

    # One attempt: the remaining segments in micro-batches, until done or out of memory.
    def _attempt(
        self, segments: list[_Segment], micro_batch: int, arrivals: GradArrivals | None
    ) -> list[_Segment]:
        remaining = list(segments)
        while remaining:
            segment = remaining[0]
            stop = min(segment.start + micro_batch, segment.stop)
            if arrivals is not None:
                arrivals.reset()
            result = self._try_micro_batch(segment.start, stop, segment.done)
            if result is None:
                interrupted = dict(segment.done)
                if arrivals is not None:
                    interrupted.update(arrivals.arrived())
                left = [_Segment(segment.start, stop, interrupted)]
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
        try:
            result = self._micro_batch(start, stop, done)
        except RuntimeError as error:
            if not is_out_of_memory(error):
                raise
            # Only note it: the exception holds the failed micro-batch's frames, and with them
            # its activations, until this block ends.
            failed = True
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

    def _slice(self, start: int, stop: int) -> Any:
        if (start, stop) == (0, self.samples):
            return self.batch
        return slice_batch(self.batch, start, stop, self.samples)

    def _check_fault(self, size: int) -> None:
        limit = self.module.oom_state.fault_above[self.phase]
        if limit is not None and size > limit:
            raise torch.cuda.OutOfMemoryError(
                f"injected by fault.oom_{self.phase}_above={limit}: "
                f"a {self.phase} micro-batch of {size} samples"
            )

    def _decide(self, failed: bool, micro_batch: int, failures: int) -> Decision:
        strategy = self.trainer.strategy
        return decide(
            failed,
            micro_batch,
            failures,
            lambda flag: bool(strategy.reduce_boolean_decision(flag, all=False)),
            last_resort=self.phase == "train",
        )

    def _where(self) -> str:
        return (
            f"{self.phase} step of epoch {self.trainer.current_epoch}, batch {self.batch_idx} "
            f"({self.samples} samples)"
        )

    def _say(self, message: str, *args: Any) -> None:
        if self.trainer.is_global_zero:
            log.warning(message, *args)

    def _give_up(self, micro_batch: int) -> None:
        state = self.module.oom_state
        where = (
            f" The last-resort checkpoint is {state.last_resort_checkpoint}."
            if state.last_resort_checkpoint
            else ""
        )
        raise torch.cuda.OutOfMemoryError(
            f"out of memory in the {self._where()} with {micro_batch} sample per micro-batch: "
            f"nothing smaller is left to try.{where} Plan the run with "
            "`python scripts/plan_memory.py` and apply one of its remedies (gradient "
            "checkpointing, a lower precision, a smaller model or input size)."
        )


class TrainingStepRunner(_StepRunner):
    """A training step whose gradients are accumulated micro-batch by micro-batch."""

    phase = "train"

    def run(self) -> Any:
        module, trainer, state = self.module, self.trainer, self.module.oom_state
        accumulate = trainer.accumulate_grad_batches
        state.skip_zero_grad = state.backward_done = False
        # Lightning zeroes the gradients after training_step returns (it runs the step first);
        # this step fills them itself, so it zeroes them first and Lightning's call is skipped.
        if self.batch_idx % accumulate == 0:
            module.optimizer_zero_grad(trainer.current_epoch, self.batch_idx, trainer.optimizers[0])
            state.skip_zero_grad = True

        segments = [_Segment(0, self.samples)]
        failures = 0
        with GradArrivals(module.parameters()).watching() as arrivals:
            while True:
                micro_batch = state.train_micro_batch or self.samples
                segments = self._attempt(segments, micro_batch, arrivals)
                decision = self._decide(bool(segments), micro_batch, failures)
                if decision.action is Action.DONE:
                    break
                failures += 1
                release_memory(module.device)
                if decision.action is Action.GIVE_UP:
                    self._give_up(micro_batch)
                state.train_recoveries += 1
                state.train_micro_batch = decision.micro_batch
                if decision.action is Action.LAST_RESORT:
                    self._last_resort(decision.micro_batch)
                else:
                    self._say(
                        "Out of memory in the %s: redoing its unfinished samples in micro-batches "
                        "of %d with gradient accumulation (%d per batch x accumulate_grad_batches "
                        "%d; same effective batch) and keeping that micro-batch for the rest of "
                        "the run.",
                        self._where(),
                        decision.micro_batch,
                        math.ceil(self.samples / decision.micro_batch),
                        accumulate,
                    )

        self.logs.replay(module.log)
        self._report(accumulate)
        return self._lightning_output()

    def _micro_batch(
        self, start: int, stop: int, done: dict[int, torch.nn.Parameter]
    ) -> _MicroResult:
        module = self.module
        size = stop - start
        self._check_fault(size)
        micro = self._slice(start, stop)
        with self.logs.capture(module, size), GradArrivals.frozen(done.values()):
            output = self.step(module, micro, self.batch_idx, *self.extra)
            loss, extras = _loss_and_extras(output)
            terms = extras.pop(LOSS_TERMS, None)
            if loss is None:
                return _MicroResult(None, None)
            share = loss if micro is self.batch else self._share_of_batch_loss(loss, terms, micro)
            # Lightning divides the returned loss by accumulate_grad_batches before its own
            # backward pass; this one must do the same.
            scaled = share / self.trainer.accumulate_grad_batches
            if scaled.requires_grad:
                scaler = getattr(self.trainer.precision_plugin, "scaler", None)
                if scaler is not None:
                    scaled = scaler.scale(scaled)
                # Backward passes run outside autocast, as in Lightning's own loop.
                with torch.autocast(module.device.type, enabled=False):
                    module.backward(scaled)
            return _MicroResult(share.detach(), _detached(extras))

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

    def _last_resort(self, micro_batch: int) -> None:
        """Save a checkpoint and continue from it: the optimizer state is dropped from the
        device and loaded back from the file into freshly emptied memory."""
        module, trainer, state = self.module, self.trainer, self.module.oom_state
        checkpoint_callback = trainer.checkpoint_callback
        folder = getattr(checkpoint_callback, "dirpath", None) or (
            Path(trainer.default_root_dir) / "checkpoints"
        )
        path = Path(folder) / LAST_RESORT_CHECKPOINT
        # Every process calls it, the strategy writes once; the optimizer state must be in it.
        trainer.save_checkpoint(path, weights_only=False)
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
        accumulate = trainer.accumulate_grad_batches * per_batch
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

    def _report(self, accumulate: int) -> None:
        state = self.module.oom_state
        if not state.train_recoveries:
            return
        micro_batch = state.train_micro_batch or self.samples
        metrics = {
            "oom/train_recoveries": (state.train_recoveries, "max"),
            "oom/train_micro_batch": (micro_batch, "min"),
            "oom/train_accumulation": (math.ceil(self.samples / micro_batch) * accumulate, "max"),
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
        state = self.module.oom_state
        state.backward_done = True
        value = torch.stack(losses).sum()
        strategy = self.trainer.strategy
        if isinstance(strategy, DDPStrategy) and self.trainer.world_size > 1:
            # DDP all-reduces gradients from hooks that fire during the backward pass of the
            # returned loss. A zero-valued sum over every parameter fires them all, and the
            # gradients accumulated above are what gets reduced. Its gradient is an expanded
            # zero, so it allocates nothing.
            touch = sum(p.sum() for p in self.module.parameters() if p.requires_grad)
            value = value + touch * 0.0
        extras = next((r.output for r in reversed(self.results) if r.output), None)
        return {"loss": value, **extras} if extras else value


class ValidationStepRunner(_StepRunner):
    """A validation step run in micro-batches of the size validation has learned to fit."""

    phase = "val"

    def run(self) -> Any:
        module, state = self.module, self.module.oom_state
        segments = [_Segment(0, self.samples)]
        failures = 0
        while True:
            micro_batch = state.val_micro_batch or self.samples
            segments = self._attempt(segments, micro_batch, None)
            decision = self._decide(bool(segments), micro_batch, failures)
            if decision.action is Action.DONE:
                break
            failures += 1
            release_memory(module.device)
            if decision.action is Action.GIVE_UP:
                self._give_up(micro_batch)
            state.val_recoveries += 1
            state.val_micro_batch = decision.micro_batch
            self._say(
                "Out of memory in the %s: running it in micro-batches of %d (the same metrics) "
                "and keeping that validation micro-batch for the rest of the run.",
                self._where(),
                decision.micro_batch,
            )
        self.logs.replay(module.log)
        if state.val_recoveries:
            for name, value, reduce_fx in (
                ("oom/val_recoveries", state.val_recoveries, "max"),
                ("oom/val_micro_batch", state.val_micro_batch or self.samples, "min"),
            ):
                module.log(name, float(value), reduce_fx=reduce_fx, batch_size=self.samples)
        # Lightning keeps no validation outputs; callbacks see the last micro-batch's.
        return self.results[-1].output if self.results else None

    def _micro_batch(
        self, start: int, stop: int, done: dict[int, torch.nn.Parameter]
    ) -> _MicroResult:
        size = stop - start
        self._check_fault(size)
        with self.logs.capture(self.module, size):
            output = self.step(self.module, self._slice(start, stop), self.batch_idx, *self.extra)
        return _MicroResult(None, output)


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
