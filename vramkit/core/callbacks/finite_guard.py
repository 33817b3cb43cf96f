"""Finite or stopped: a diverged run never trains on, and never saves, non-finite numbers.

Checked, at no measurable cost when every number is finite:

- the gradients, before each optimizer step: without a gradient scaler, one fused check of all
  of them (GradScaler's own kernel, ``torch._amp_foreach_non_finite_check_and_unscale_`` with a
  scale of 1, one read per gradient and a single host sync; on a CPU it is about 6x cheaper than
  ``torch._foreach_norm``, see benchmarks/finite_guard.py). Under ``16-mixed`` the GradScaler
  already checks them and skips such a step, which is normal; only a loss scale pushed below
  ``min_loss_scale`` by skip after skip counts as non-finite gradients;
- the loss of every training step. Under automatic optimization without a scaler, the loss
  Lightning backpropagates is added to the gradients' fused check (``on_before_backward`` hands
  it over), so one host read answers both: the loss Lightning hands to ``on_train_batch_end``
  is a detached copy of that very loss (``ClosureResult._clone_loss`` in
  lightning/pytorch/loops/optimization/automatic.py; divided by ``accumulate_grad_batches``,
  which keeps a finite number finite and a NaN or inf not finite). Only when the fused check
  finds something are the gradients checked again alone, to name which; the loss is then read
  where it always was, after the step, so messages, counts and policies do not change. The
  loss needs no check before backward: a backward pass through a NaN loss writes NaN into the
  gradients, which the same check finds before any optimizer step. On the batches of an
  accumulation window that do not step, under a scaler and under manual optimization (where
  the returned loss need not be one that was backpropagated), the loss is read alone after
  the batch (one host sync of a scalar). Under ``skip_step`` and ``rollback`` also every
  floating-point weight and buffer after the step, in one sync (the fused check reads them
  into one flag, with the loss where it was not checked before the step): a weight or buffer
  can turn non-finite while the loss and gradients stay finite (a parameter the loss does not
  reach, a BatchNorm running statistic), and only a check at the step can still roll it back;
- every monitored metric, after validation (a non-finite one is named, and
  :class:`~vramkit.core.callbacks.checkpoints.finite_model_checkpoint.FiniteModelCheckpoint` never
  ranks it
  as best);
- the weights and buffers in every checkpoint about to be written (``ModelCheckpoint``,
  ``last.ckpt``, the periodic ones of checkpoint retention): a non-finite one stops the run
  instead, so the last finite checkpoint is never overwritten with NaN.

What a non-finite loss, gradient, weight or buffer does is ``on_non_finite``:

- ``stop`` (the default): the run ends with :class:`TrainingDiverged`, one message naming the
  step, the epoch and the last finite checkpoint; ``train.py`` exits with status 3;
- ``skip_step``: the optimizer step is skipped (gradients dropped), counted and warned about. A
  non-finite weight or buffer was made by a step already taken, which only a copy can undo: the
  weights, buffers and optimizer state of the last finite checkpoint are loaded instead, the
  learning rate unchanged;
- ``rollback``: the step is skipped, then the weights, buffers and optimizer state of the last
  finite checkpoint are loaded and the learning rate halved (its schedule's base rates too, so
  the halving lasts and travels in later checkpoints), with a warning.

``skip_step`` and ``rollback`` stop like ``stop`` after ``max_non_finite_in_a_row`` non-finite steps
without a finite one between them.
"""

from __future__ import annotations

import functools
import itertools
import logging
import math
import operator
import shlex
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from pydantic import Field

from vramkit.core.compat import torch_private
from vramkit.core.config.schema import ConfigError
from vramkit.core.config.settings import Settings
from vramkit.core.config.source import command_line_overrides, override_key
from vramkit.core.trainer_assembly.batch_hooks import switch_batch_hook

log = logging.getLogger(__name__)


class FiniteGuardSettings(Settings):
    """The keys of ``callbacks.finite_guard`` (conf/callbacks/finite_guard.yaml)."""

    on_non_finite: Literal["stop", "skip_step", "rollback"] = "stop"
    """What a non-finite loss, gradient, weight or buffer does: stop the run, skip the optimizer
    step (a weight or buffer: back to the last finite checkpoint), or roll back to the last
    finite checkpoint with half the learning rate."""
    max_non_finite_in_a_row: int = Field(3, ge=1)
    """skip_step, rollback: non-finite steps in a row that are tolerated; one more stops."""
    min_loss_scale: float = Field(1.0, gt=0)
    """16-mixed: a GradScaler scale below this counts as non-finite gradients (each skipped
    step halves it; from its start of 65536 that is 17 skips without a finite step)."""


class TrainingDiverged(RuntimeError):
    """A loss, gradient or weight is not finite and the run stopped; the message says where
    and which checkpoint is the last finite one. ``train.py`` prints it alone and exits with
    status 3 (:data:`vramkit.core.run.refusal.exit_codes.EXIT_DIVERGED`); in a multirun the job
    fails and the sweep goes on."""


class FiniteGuard(L.Callback):
    """Checks losses, gradients, monitored metrics and checkpointed weights for NaN and inf
    (module docstring).

    Its keys are the fields of `FiniteGuardSettings`, given as keyword arguments
    and kept validated in ``self.settings`` (see `vramkit.core.config.settings`).
    """

    settings_class = FiniteGuardSettings

    def __init__(self, **settings: Any) -> None:
        self.settings = FiniteGuardSettings.for_component(type(self), settings)
        self.non_finite_in_a_row = 0
        self.skipped_steps = 0  # optimizer steps skipped by skip_step or rollback
        self.rollbacks = 0
        self._scaler: Any = None  # the precision plugin's GradScaler, if any
        self._bad_gradients = False  # this step's gradients were not finite (step skipped)
        self._weights_checked = False  # skip_step, rollback: weights checked after each step
        self._loss: torch.Tensor | None = None  # this batch's backpropagated loss, unchecked
        self._loss_checked = False  # this batch's loss was found finite with its gradients
        self._state: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._scaler = getattr(trainer.precision_plugin, "scaler", None)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # Decided once: each of these was an attribute walk at every step.
        self._weights_checked = self.settings.on_non_finite != "stop"
        # The backpropagated loss joins the gradients' check only under automatic optimization
        # without a scaler (module docstring); elsewhere Lightning need not call this hook.
        fold_loss = self._scaler is None and pl_module.automatic_optimization
        switch_batch_hook(self, "on_before_backward", on=fold_loss)
        if self._weights_checked:
            # Gathered once (weights and buffers change in place: optimizers, BatchNorm,
            # load_state_dict): walking the modules each step cost more than checking them.
            self._state = floating_state(pl_module)
        # A step size beyond the weights' largest number is not a divergence but a crash in the
        # optimizer's own arithmetic (Adam: "value cannot be converted to type float without
        # overflow" at lr=1e38, whose first step is lr / (1 - beta1)): refused here instead.
        for index, optimizer in enumerate(trainer.optimizers):
            for group in optimizer.param_groups:
                lr = float(group.get("lr", 0.0))
                beta1 = group.get("betas", (0.0,))[0]
                step = lr / (1 - beta1) if beta1 < 1 else lr
                largest = min(
                    (torch.finfo(p.dtype).max for p in group["params"] if p.is_floating_point()),
                    default=math.inf,
                )
                if not math.isfinite(lr) or abs(step) > largest:
                    raise ConfigError(
                        f"learning rate {lr:g} of optimizer {index} gives steps up to "
                        f"{step:g}, beyond the largest number its weights hold ({largest:g}): "
                        "lower the learning rate (model.optimizer.lr)"
                    )

    def on_before_backward(
        self, trainer: L.Trainer, pl_module: L.LightningModule, loss: torch.Tensor
    ) -> None:
        # Switched on only where the loss is folded in (on_train_start): checked with the
        # gradients if this batch steps the optimizer, else read alone after the batch. A loss
        # that comes after a check (a closure run again) is the one on_train_batch_end gets.
        self._loss, self._loss_checked = loss, False

    def on_before_optimizer_step(
        self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: torch.optim.Optimizer
    ) -> None:
        if self._scaler is not None:
            return  # the GradScaler checks them itself (on_train_batch_end reads its verdict)
        gradients = gradients_of(optimizer)
        loss, self._loss = self._loss, None
        # The loss as a 1-element view: the check multiplies it by 1 in place, which changes no
        # value (its version counter moves, which matters only to a graph that saved the loss
        # for a backward pass still to come; Lightning's has run by then).
        if loss is not None and all_finite([*gradients, loss.detach().reshape(-1)]):
            self._loss_checked = True
            return
        # Something is not finite, or there was no loss to fold in: the gradients alone say
        # whether it was them. A non-finite loss alone is named after the batch, as ever.
        if all_finite(gradients):
            return
        if self.settings.on_non_finite == "stop":
            self._stop(trainer, "gradients", step=trainer.global_step + 1)
        self._bad_gradients = True
        optimizer.zero_grad(set_to_none=True)  # parameters without gradients are not stepped

    def on_train_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        if self._loss_checked:  # found finite with the gradients, before the step
            self._loss_checked = False
            if not self._weights_checked:  # stop: nothing else is checked after a step
                self.non_finite_in_a_row = 0
                return
            loss = None
        else:
            loss = outputs.get("loss") if isinstance(outputs, _MAPPINGS) else outputs
            loss = loss if isinstance(loss, torch.Tensor) else None
            self._loss = None  # a batch that did not step the optimizer: its loss is read here
        bad = []
        weights_checked = self._weights_checked
        if weights_checked and _weights_and_loss_finite(self._state, loss):
            loss = None  # finite, checked with the weights in one sync
        if loss is not None and not _finite_loss(loss):
            bad.append(f"loss ({loss.detach().float().mean().item():g})")
        if self._bad_gradients or (
            self._scaler is not None and self._scaler.get_scale() < self.settings.min_loss_scale
        ):
            bad.append("gradients")
        self._bad_gradients = False
        if weights_checked and not bad:
            name = first_non_finite_weight(pl_module)
            if name is not None:
                bad.append(f"weights ({name})")
        if not bad:
            self.non_finite_in_a_row = 0
            return
        what = " and ".join(bad)
        self.non_finite_in_a_row += 1
        if (
            self.settings.on_non_finite == "stop"
            or self.non_finite_in_a_row > self.settings.max_non_finite_in_a_row
        ):
            self._stop(trainer, what)
        if self.settings.on_non_finite == "skip_step" and bad[-1].startswith("weights"):
            self._roll_back(trainer, pl_module, what, halve=False)
        elif self.settings.on_non_finite == "skip_step":
            self.skipped_steps += 1
            log.warning(
                "non-finite %s at %s: optimizer step skipped (%d in a row, %d in all; the run "
                "stops after %d in a row)",
                what,
                _where(trainer),
                self.non_finite_in_a_row,
                self.skipped_steps,
                self.settings.max_non_finite_in_a_row,
            )
        else:
            self._roll_back(trainer, pl_module, what)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        monitors = {getattr(c, "monitor", None) for c in trainer.checkpoint_callbacks}
        monitors |= {c.monitor for c in trainer.early_stopping_callbacks}
        for name in sorted(m for m in monitors if m):
            value = trainer.callback_metrics.get(name)
            if value is not None and not bool(torch.isfinite(value).all()):
                log.warning(
                    "monitored metric %s is %s after epoch %d: it is never ranked as best",
                    name,
                    value.item() if value.numel() == 1 else value.tolist(),
                    trainer.current_epoch,
                )

    def on_save_checkpoint(
        self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        # Every trainer.save_checkpoint passes here before the file is written.
        weights = [
            t
            for t in checkpoint.get("state_dict", {}).values()
            if isinstance(t, torch.Tensor) and t.is_floating_point()
        ]
        if weights and not _all_finite_read_only(weights):
            self._stop(trainer, "weights", "(the checkpoint about to be written was not written)")

    def _stop(
        self, trainer: L.Trainer, what: str, detail: str = "", step: int | None = None
    ) -> None:
        """Raise :class:`TrainingDiverged`; ``step``: the 1-based optimizer step that met the
        non-finite value (default: the last one taken)."""
        last = last_finite_checkpoint(trainer)
        kept = (
            f"the last finite checkpoint is {last}"
            if last is not None
            else "no checkpoint was written before it"
        )
        advice = (
            f"; resume it at half the learning rate: {resume_command(trainer, last)}"
            if last is not None
            else ""
        )
        tolerated = (
            f" after {self.non_finite_in_a_row} in a row ({self.settings.on_non_finite})"
            if self.settings.on_non_finite != "stop" and self.non_finite_in_a_row
            else ""
        )
        raise TrainingDiverged(
            f"training diverged: non-finite {what} at {_where(trainer, step)}{tolerated}"
            f"{' ' + detail if detail else ''}; {kept}. callbacks.finite_guard.on_non_finite="
            f"skip_step or rollback tolerates a few (conf/callbacks/finite_guard.yaml){advice}"
        )

    def _roll_back(
        self, trainer: L.Trainer, pl_module: L.LightningModule, what: str, *, halve: bool = True
    ) -> None:
        """Load the weights, buffers and optimizer state of the last finite checkpoint; with
        ``halve`` also halve the learning rate for good (rollback), else keep it (skip_step on
        a weight or buffer)."""
        path = last_finite_checkpoint(trainer)
        if path is None:
            self._stop(trainer, what, "with no finite checkpoint to roll back to")
        rates = [[group["lr"] for group in opt.param_groups] for opt in trainer.optimizers]
        checkpoint = trainer.strategy.load_checkpoint(path)
        trainer.strategy.load_model_state_dict(checkpoint, strict=True)
        trainer.strategy.load_optimizer_state_dict(checkpoint)
        # The optimizer's state brings the checkpoint's rates; the rates trained with go on.
        factor = 0.5 if halve else 1.0
        for optimizer, old in zip(trainer.optimizers, rates, strict=True):
            for group, rate in zip(optimizer.param_groups, old, strict=True):
                group["lr"] = rate * factor
                if "initial_lr" in group:
                    group["initial_lr"] *= factor
        for config in trainer.lr_scheduler_configs:
            base_lrs = getattr(config.scheduler, "base_lrs", None)
            if base_lrs is not None:  # the schedule multiplies these: halve them for good
                config.scheduler.base_lrs = [rate * factor for rate in base_lrs]
        self.rollbacks += halve
        self.skipped_steps += 1
        rates_now = ", ".join(
            f"{g['lr']:.3g}" for opt in trainer.optimizers for g in opt.param_groups
        )
        log.warning(
            "non-finite %s at %s: rolled back to the weights, buffers and optimizer state of %s "
            "%s (now %s; %d in a row, the run stops after %d)",
            what,
            _where(trainer),
            path,
            "and halved the learning rate"
            if halve
            else "(skip_step: the step that made them non-finite is undone that way), learning "
            "rate kept",
            rates_now,
            self.non_finite_in_a_row,
            self.settings.max_non_finite_in_a_row,
        )

    def state_dict(self) -> dict[str, Any]:
        return {"skipped_steps": self.skipped_steps, "rollbacks": self.rollbacks}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.skipped_steps = state_dict.get("skipped_steps", 0)
        self.rollbacks = state_dict.get("rollbacks", 0)


# dict first: the Mapping ABC's isinstance test costs several times more, every step; a tuple,
# not ``dict | Mapping``, which built a new union object at every call.
_MAPPINGS = (dict, Mapping)
_GRAD = operator.attrgetter("grad")
_IS_SET = functools.partial(operator.is_not, None)


def gradients_of(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """The gradients of ``optimizer``'s parameters that have one, in its order.

    Gathered by ``map`` and ``filter`` over C callables, so no Python bytecode runs per
    parameter: with a comprehension, the walk and the grouping of :func:`all_finite` cost
    about 37 bytecodes per parameter tensor and step (opcode tracing of
    ``benchmarks/step_overhead.py``), several hundred microseconds on a model of 600 tensors.
    """
    params = itertools.chain.from_iterable([group["params"] for group in optimizer.param_groups])
    return list(filter(_IS_SET, map(_GRAD, params)))


def all_finite(tensors: list[torch.Tensor]) -> bool:
    """Whether every element of ``tensors`` (gradients) is finite: GradScaler's fused check at a
    scale of 1, one kernel per device and dtype (it multiplies each tensor by 1 in place, which
    changes no value), and one host sync per device and dtype.

    The tensors are grouped by device and dtype in C++, as torch's foreach optimizers group
    theirs (``_group_tensors_by_device_and_dtype`` in torch/utils/_foreach_utils.py, called by
    ``Optimizer._group_tensors_by_device_and_dtype`` in torch/optim/optimizer.py). Called
    as that C++ function itself: its Python wrapper there is decorated with ``@no_grad()``,
    whose context object costs about 90 bytecodes per step, and gradients have no graph."""
    if not tensors:
        return True
    groups = torch_private.group_tensors_by_device_and_dtype([tensors], False)
    for (device, _), ((group,), _) in groups.items():
        found_inf, one = _scratch(device)
        found_inf.zero_()
        torch_private.non_finite_check_and_unscale_(group, found_inf, one)
        if found_inf.item():
            return False
    return True


def _weights_and_loss_finite(
    state: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]], loss: torch.Tensor | None
) -> bool:
    """Whether every tensor of ``state`` (`floating_state`) and ``loss`` is finite: the fused
    check of `all_finite` on each device and dtype into one flag per device, the loss's verdict
    added, and one host sync (the one the loss alone costs)."""
    groups = dict(state)
    if loss is not None:
        key = (loss.device, torch.float32)
        groups[key] = [*groups.get(key, []), loss.detach().reshape(-1).float()]
    flags: dict[torch.device, torch.Tensor] = {}
    with torch.no_grad():  # multiplies the weights by 1 in place: no value and no graph changes
        for (device, _), group in groups.items():
            if device not in flags:
                flags[device] = _scratch(device)[0]
                flags[device].zero_()
            torch_private.non_finite_check_and_unscale_(group, flags[device], _scratch(device)[1])
    if not flags:
        return True
    first, *others = flags.values()
    return not bool(sum((flag.to(first.device) for flag in others), first).item())


def first_non_finite_weight(module: torch.nn.Module) -> str | None:
    """The name of the first floating-point parameter or buffer of ``module`` holding NaN or inf,
    or None (one check per tensor: for the message, after the fused check found one)."""
    named = [*module.named_parameters(), *module.named_buffers()]
    for name, tensor in named:
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor.detach()).all()):
            return name
    return None


def floating_state(
    module: torch.nn.Module,
) -> dict[tuple[torch.device, torch.dtype], list[torch.Tensor]]:
    """The floating-point parameters and buffers of ``module``, detached (the fused check writes
    into them, times 1, which autograd must not see), by device and dtype."""
    groups: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
    for tensor in [*module.parameters(), *module.buffers()]:
        if tensor.is_floating_point() and tensor.numel():
            groups.setdefault((tensor.device, tensor.dtype), []).append(tensor.detach())
    return groups


@functools.cache
def _scratch(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    # The check's flag and its scale of 1, made once per device: making them every step cost
    # more than the check itself on a small CPU model (benchmarks/finite_guard.py).
    return torch.zeros((), device=device), torch.ones((), device=device)


def _finite_loss(loss: torch.Tensor) -> bool:
    # A scalar's .item() is a few times cheaper than isfinite(...).all() on a CPU.
    if loss.numel() == 1:
        return math.isfinite(loss.item())
    return bool(torch.isfinite(loss.detach()).all())


def _all_finite_read_only(tensors: Iterable[torch.Tensor]) -> bool:
    # Weights are checked where a checkpoint is written (rare), without touching them: the
    # largest magnitude per tensor, which overflows nowhere and carries NaN.
    norms = torch_private.foreach_max_norm([t.detach() for t in tensors])
    return all(bool(torch.isfinite(n)) for n in norms)


_RESUME_KEYS = ("ckpt_path", "init_from", "model.optimizer.lr", "resume.allow_changes")


def resume_command(trainer: L.Trainer, checkpoint: Path) -> str:
    """The command that resumes ``checkpoint`` at half the run's peak learning rate (the
    schedule's base rate): this run's command-line overrides, the checkpoint, the rate, and
    ``resume.allow_changes=true``, which applies the rate to the optimizer and its schedule."""
    peak = next(
        (
            float(rate)
            for config in trainer.lr_scheduler_configs
            for rate in getattr(config.scheduler, "base_lrs", ())
        ),
        next((float(g["lr"]) for opt in trainer.optimizers for g in opt.param_groups), None),
    )
    kept = [o for o in command_line_overrides() if override_key(o) not in _RESUME_KEYS]
    words = ["python", "train.py", *kept, f"ckpt_path={checkpoint}"]
    if peak is not None:
        words.append(f"model.optimizer.lr={peak / 2:.3g}")
    words.append("resume.allow_changes=true")
    return " ".join(shlex.quote(word) for word in words)


def last_finite_checkpoint(trainer: L.Trainer) -> Path | None:
    """The newest checkpoint of this run (``last.ckpt``, best, top-k) or the one it resumed
    from: every write passes :class:`FiniteGuard`'s check, so it holds finite weights."""
    candidates = {trainer.ckpt_path} if trainer.ckpt_path else set()
    for callback in trainer.checkpoint_callbacks:
        if isinstance(callback, ModelCheckpoint):
            candidates |= {callback.last_model_path, callback.best_model_path}
            candidates |= set(callback.best_k_models)
    files = [Path(p) for p in candidates if p and Path(p).is_file()]
    return max(files, key=lambda p: p.stat().st_mtime_ns) if files else None


def _where(trainer: L.Trainer, step: int | None = None) -> str:
    step = trainer.global_step if step is None else step
    return f"step {step} (epoch {trainer.current_epoch})"
