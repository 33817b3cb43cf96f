"""The training loaders' positions travel with the checkpoint, even where Lightning drops them."""

from __future__ import annotations

from typing import Any

import lightning as L

from vramkit.core.compat import lightning_private, torch_private


def stateful_train_loaders(trainer: L.Trainer) -> list[Any]:
    """The training loaders of ``trainer`` that have ``state_dict`` / ``load_state_dict``."""
    loaders = torch_private.tree_leaves(trainer.train_dataloader)
    return [loader for loader in loaders if lightning_private.is_stateful(loader)]


class LoaderPosition(L.Callback):
    """Saves the state of every stateful training loader and gives it back on resume.

    Lightning saves and restores such states itself, but not when the LightningModule reads
    ``trainer.estimated_stepping_batches`` in ``configure_optimizers`` (every task with a
    per-step schedule does): that builds the loaders before the checkpoint is read, and the
    saved states are then never handed to them (Lightning issue #20550, open in 2.6), so a run
    resumed mid-epoch would start that epoch from its first batch. The states are given back at
    ``on_train_start``; vramkit's
    :class:`~vramkit.core.data.resumable_loader.ResumableDataLoader` reads nothing before its
    first batch, which comes later. Giving the same state twice (where Lightning's own restore
    works) changes nothing.
    """

    def __init__(self) -> None:
        self._trainer: L.Trainer | None = None
        self._saved: list[dict[str, Any]] | None = None  # read from a checkpoint, not yet given

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._trainer = trainer

    def state_dict(self) -> dict[str, Any]:
        if self._trainer is None or self._trainer.train_dataloader is None:
            return {"loaders": []}
        return {
            "loaders": [loader.state_dict() for loader in stateful_train_loaders(self._trainer)]
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._saved = list(state_dict.get("loaders", []))

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not self._saved:
            return
        loaders = stateful_train_loaders(trainer)
        if len(loaders) != len(self._saved):
            raise RuntimeError(
                f"the checkpoint holds the positions of {len(self._saved)} training loaders, "
                f"this run has {len(loaders)} stateful ones: resume with the same data settings"
            )
        for loader, state in zip(loaders, self._saved, strict=True):
            loader.load_state_dict(state)
        self._saved = None
