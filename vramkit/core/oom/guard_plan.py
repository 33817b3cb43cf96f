"""What the OOM guard decides once per training epoch instead of on every step."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from lightning.pytorch.plugins.precision import MixedPrecision
from lightning.pytorch.strategies import DDPStrategy, DeepSpeedStrategy, SingleDeviceStrategy
from torch.nn.parallel import DistributedDataParallel

from vramkit.core.compat import lightning_private
from vramkit.core.oom.grad_arrivals import GradArrivals

if TYPE_CHECKING:
    import lightning as L


def training_guard_applies(module: L.LightningModule) -> str | None:
    """Why training steps of ``module`` (attached to a Trainer) cannot be guarded in this run,
    or None when they can."""
    trainer = module.trainer
    if not module.automatic_optimization:
        return "the module uses manual optimization"
    strategy = trainer.strategy
    supported = isinstance(strategy, (SingleDeviceStrategy, DDPStrategy)) and not isinstance(
        strategy, DeepSpeedStrategy
    )
    if not supported or strategy.handles_gradient_accumulation:
        return f"strategy {type(strategy).__name__} runs its own backward pass"
    return None


@dataclass(eq=False)
class GuardPlan:
    """The facts a guarded training step needs, gathered at the first step of an epoch.

    A strategy, a precision plugin or the set of trainable parameters does not change within
    an epoch (a fine-tuning schedule or a gradient-accumulation schedule changes them between
    epochs), so a step reads them here instead of walking the module or the strategy again.
    """

    trainer: L.Trainer
    epoch: int  # the training epoch this plan was made for
    unguarded_reason: str | None  # why steps run without the guard; None: they are guarded
    ddp: DistributedDataParallel | None  # the DDP wrapper of a multi-process run, else None
    trainable: tuple[torch.nn.Parameter, ...]  # parameters that receive gradients
    autocast: bool  # steps run under the precision plugin's autocast (mixed precision)
    scaler: Any  # the precision plugin's GradScaler (16-mixed), else None
    arrivals: GradArrivals | None  # installed while gradients accumulate over batches

    @classmethod
    def for_epoch(cls, module: L.LightningModule) -> GuardPlan:
        """The plan for ``module``'s current training epoch; installs the gradient-arrival
        hooks when ``accumulate_grad_batches`` > 1 (a later batch of an accumulation window
        holds earlier batches' gradients, which an interrupted backward pass must not spoil)."""
        trainer = module.trainer
        reason = training_guard_applies(module)
        trainable = tuple(p for p in module.parameters() if p.requires_grad)
        strategy = trainer.strategy
        ddp = strategy.model if isinstance(strategy, DDPStrategy) else None
        if not isinstance(ddp, DistributedDataParallel) or trainer.world_size < 2:
            ddp = None
        arrivals = None
        if reason is None and trainer.accumulate_grad_batches > 1:
            arrivals = GradArrivals(trainable)
            arrivals.install()
        return cls(
            trainer=trainer,
            epoch=trainer.current_epoch,
            unguarded_reason=reason,
            ddp=ddp,
            trainable=trainable,
            autocast=isinstance(trainer.precision_plugin, MixedPrecision),
            scaler=getattr(trainer.precision_plugin, "scaler", None),
            arrivals=arrivals,
        )

    def holds_for(self, module: L.LightningModule) -> bool:
        """Whether this plan was made for the trainer and epoch ``module`` is in now."""
        trainer = lightning_private.attached_trainer(module)
        return trainer is self.trainer and trainer.current_epoch == self.epoch

    def release(self) -> None:
        """Remove the hooks this plan installed."""
        if self.arrivals is not None:
            self.arrivals.remove()

    # A copy or a pickle of the module (weight averaging, torch.save(model)) takes no plan:
    # the plan refers to the trainer and to hooks on the original's parameters.
    def __deepcopy__(self, memo: dict[int, Any]) -> None:
        return None

    def __reduce__(self) -> tuple[type[None], tuple[()]]:
        return type(None), ()
