"""``ModelCheckpoint`` that never ranks a non-finite metric as best."""

from __future__ import annotations

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint


class FiniteModelCheckpoint(ModelCheckpoint):
    """Lightning's top-k checkpoints, with NaN and inf values of the monitored metric left out.

    Lightning's own ranking keeps any value while fewer than ``save_top_k`` checkpoints exist
    (``check_monitor_top_k``), so a run whose first validation gives NaN (a diverged model) saves
    it as the best checkpoint and reports it as "best" at the end; with ``save_top_k: -1``
    every NaN epoch is kept. Here a non-finite value is never a top-k checkpoint; the metric
    is named in a warning by :class:`~vramkit.core.callbacks.finite_guard.FiniteGuard`.
    """

    def check_monitor_top_k(self, trainer: L.Trainer, current: torch.Tensor | None = None) -> bool:
        if current is not None and not bool(torch.isfinite(current).all()):
            return False  # metrics are synced across processes: every process decides alike
        return super().check_monitor_top_k(trainer, current)
