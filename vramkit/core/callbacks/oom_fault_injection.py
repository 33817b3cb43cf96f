"""``+fault.oom_train_above=N`` / ``+fault.oom_val_above=N``: rehearse OOM recovery anywhere."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import lightning as L

from vramkit.core.oom.resilient_module import OOMResilientModule

log = logging.getLogger(__name__)

FAULT_KEYS = ("oom_train_above", "oom_val_above")


class OOMFaultInjection(L.Callback):
    """Makes every training (validation) micro-batch of more than N samples raise
    ``torch.cuda.OutOfMemoryError``, so the recovery of :class:`OOMResilientModule` runs on a
    CPU or a roomy GPU exactly as it would on a full one. Both limits None: does nothing.
    """

    def __init__(self, oom_train_above: int | None = None, oom_val_above: int | None = None):
        for key, value in zip(FAULT_KEYS, (oom_train_above, oom_val_above), strict=True):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise ValueError(f"fault.{key} must be an integer >= 1 or null, got {value!r}")
            if value is not None and value < 1:
                raise ValueError(f"fault.{key} must be >= 1 (a sample must fit), got {value}")
        self.oom_train_above = oom_train_above
        self.oom_val_above = oom_val_above

    @classmethod
    def from_config(cls, fault: Mapping[str, Any] | None = None) -> OOMFaultInjection:
        """Build it from the ``fault`` config node (absent or null: no fault), refusing keys it
        does not know, so a typo such as ``+fault.oom_trian_above=2`` is an error."""
        if fault is None:
            return cls()
        if not isinstance(fault, Mapping):
            raise ValueError(f"fault must be a mapping of {', '.join(FAULT_KEYS)}, got {fault!r}")
        unknown = sorted(set(fault) - set(FAULT_KEYS))
        if unknown:
            raise ValueError(
                f"fault.{unknown[0]} is not a fault switch (known: {', '.join(FAULT_KEYS)})"
            )
        return cls(**fault)

    @property
    def active(self) -> bool:
        return self.oom_train_above is not None or self.oom_val_above is not None

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
