"""``+fault.oom_train_above=N`` / ``+fault.oom_val_above=N``: rehearse OOM recovery anywhere."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import lightning as L
from pydantic import Field

from vramkit.core.config.settings import Settings
from vramkit.core.oom.resilient_module import OOMResilientModule

log = logging.getLogger(__name__)


class FaultSettings(Settings):
    """The run's ``fault`` node, given on the command line (``+fault.oom_train_above=2``)."""

    oom_train_above: int | None = Field(None, ge=1)
    """Training micro-batches of more samples raise an OOM; null: none does (≥ 1: one fits)."""
    oom_val_above: int | None = Field(None, ge=1)
    """Validation micro-batches of more samples raise an OOM; null: none does."""


class OOMFaultInjection(L.Callback):
    """Makes every training (validation) micro-batch of more than N samples raise
    ``torch.cuda.OutOfMemoryError``, so the recovery of :class:`OOMResilientModule` runs on a
    CPU or a roomy GPU exactly as it would on a full one. Both limits None: does nothing.

    Its keys are the fields of `FaultSettings`, given as keyword arguments and kept validated
    in ``self.settings`` (see `vramkit.core.config.settings`).
    """

    settings_class = FaultSettings

    def __init__(self, **settings: Any) -> None:
        self.settings = FaultSettings.from_node(settings, node="fault")

    @classmethod
    def from_config(cls, fault: Mapping[str, Any] | None = None) -> OOMFaultInjection:
        """Build it from the ``fault`` config node (absent or null: no fault)."""
        return cls(**(fault or {}))

    @property
    def active(self) -> bool:
        return self.settings.oom_train_above is not None or self.settings.oom_val_above is not None

    def nothing_to_do(
        self, trainer: L.Trainer, datamodule: L.LightningDataModule | None
    ) -> str | None:
        """Without a limit there is no fault to inject (see ``working_set.py``)."""
        return None if self.active else "no fault.oom_train_above or fault.oom_val_above given"

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if not self.active:
            return
        if not isinstance(pl_module, OOMResilientModule):
            raise TypeError(
                f"fault injection needs a module built on OOMResilientModule; "
                f"{type(pl_module).__name__} has no OOM recovery to rehearse"
            )
        pl_module.inject_oom_above(
            train=self.settings.oom_train_above, val=self.settings.oom_val_above
        )
        log.warning(
            "Fault injection on: training micro-batches above %s and validation micro-batches "
            "above %s samples raise torch.cuda.OutOfMemoryError",
            self.settings.oom_train_above,
            self.settings.oom_val_above,
        )

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if self.active and isinstance(pl_module, OOMResilientModule):
            pl_module.inject_oom_above(train=None, val=None)
