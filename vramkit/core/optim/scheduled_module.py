"""The optimizer, learning-rate schedule and ``torch.compile`` plumbing of the task modules."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from vramkit.core.config.source import source_of
from vramkit.core.optim.lr_schedules import WarmupDecaySchedule

OptimizerFactory = Callable[..., torch.optim.Optimizer]


class ScheduledOptimization:
    """A LightningModule mixin: one optimizer over all parameters, stepped by a
    :class:`WarmupDecaySchedule` every optimizer step, and an optionally compiled network.

    Listed before the LightningModule base (``class M(ScheduledOptimization, OOMResilientModule)``)
    so its ``configure_model`` and ``configure_optimizers`` are the ones Lightning calls; the
    module calls :meth:`init_optimization` in its ``__init__``. Nothing here is a submodule or
    a buffer, so checkpoints hold the same state dict keys as a module without it.
    """

    optimizer_factory: OptimizerFactory
    lr_schedule: WarmupDecaySchedule
    compiled_network: str | None

    def init_optimization(
        self,
        optimizer: OptimizerFactory,
        lr_schedule: Mapping[str, Any] | None,
        *,
        compile: bool,
        network: str,
    ) -> None:
        """Keep the optimizer factory (called as ``optimizer(params=...)``) and the schedule's
        options; with ``compile``, the submodule named ``network`` is compiled in
        ``configure_model``."""
        self.optimizer_factory = optimizer
        self.lr_schedule = WarmupDecaySchedule.from_config(
            lr_schedule or {},
            key_prefix="model.lr_schedule.",
            source=source_of("model"),
        )
        self.compiled_network = network if compile else None

    def configure_model(self) -> None:
        """Compile the network, in place, when asked to."""
        # In place, so checkpoints keep the plain parameter names (no `_orig_mod.` prefix).
        if self.compiled_network is not None:
            getattr(self, self.compiled_network).compile()

    def configure_optimizers(self) -> dict[str, Any]:
        """The optimizer over every parameter and its per-step schedule over the whole fit."""
        optimizer = self.optimizer_factory(params=self.parameters())
        return self.lr_schedule.lightning_config(
            optimizer, int(self.trainer.estimated_stepping_batches)
        )
