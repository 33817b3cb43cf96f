"""``+fault.oom_train_above=N`` / ``+fault.oom_val_above=N``: rehearse OOM recovery anywhere."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import lightning as L

from vramkit.core.config.schema import check_settings
from vramkit.core.config.source import source_of
from vramkit.core.oom.resilient_module import OOMResilientModule

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FaultSettings:
    """The run's ``fault`` node, given on the command line (``+fault.oom_train_above=2``)."""

    oom_train_above: int | None = field(default=None, metadata={"ge": 1})
    """Training micro-batches of more samples raise an OOM; null: none does (≥ 1: one fits)."""
    oom_val_above: int | None = field(default=None, metadata={"ge": 1})
    """Validation micro-batches of more samples raise an OOM; null: none does."""


class OOMFaultInjection(L.Callback):
    """Makes every training (validation) micro-batch of more than N samples raise
    ``torch.cuda.OutOfMemoryError``, so the recovery of :class:`OOMResilientModule` runs on a
    CPU or a roomy GPU exactly as it would on a full one. Both limits None: does nothing.
    """

    def __init__(self, oom_train_above: int | None = None, oom_val_above: int | None = None):
        settings = _fault_settings(
            {"oom_train_above": oom_train_above, "oom_val_above": oom_val_above}
        )
        self.oom_train_above = settings.oom_train_above
        self.oom_val_above = settings.oom_val_above

    @classmethod
    def from_config(cls, fault: Mapping[str, Any] | None = None) -> OOMFaultInjection:
        """Build it from the ``fault`` config node (absent or null: no fault), refusing keys it
        does not know, so a typo such as ``+fault.oom_trian_above=2`` is an error."""
        if fault is None:
            return cls()
        settings = _fault_settings(fault)
        return cls(settings.oom_train_above, settings.oom_val_above)

    @property
    def active(self) -> bool:
        return self.oom_train_above is not None or self.oom_val_above is not None

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
        pl_module.inject_oom_above(train=self.oom_train_above, val=self.oom_val_above)
        log.warning(
            "Fault injection on: training micro-batches above %s and validation micro-batches "
            "above %s samples raise torch.cuda.OutOfMemoryError",
            self.oom_train_above,
            self.oom_val_above,
        )

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if self.active and isinstance(pl_module, OOMResilientModule):
            pl_module.inject_oom_above(train=None, val=None)


def _fault_settings(values: Mapping[str, Any]) -> FaultSettings:
    return check_settings(values, FaultSettings, key_prefix="fault.", source=source_of("fault"))
