"""Rehearsing an injected OOM on a task's module: one training step and one validation, each
with and without the split, on a hand-made batch and a CPU Trainer (about a second each)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader

from vramkit.core.callbacks.memory.oom_fault_injection import OOMFaultInjection
from vramkit.core.oom.resilient_module import OOMResilientModule


class _GradientCapture(L.Callback):
    """Keeps a copy of every gradient just before the optimizer step uses them."""

    def __init__(self) -> None:
        self.gradients: dict[str, torch.Tensor] = {}

    def on_before_optimizer_step(
        self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: Any
    ) -> None:
        self.gradients = {
            name: p.grad.detach().clone()
            for name, p in pl_module.named_parameters()
            if p.grad is not None
        }


class OOMRehearsal:
    """Runs a module (made afresh by ``make_module``, same seed, same weights) on one batch."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def _trainer(self, callbacks: list[L.Callback], **options: Any) -> L.Trainer:
        return L.Trainer(
            accelerator="cpu",
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            default_root_dir=self.root,
            callbacks=callbacks,
            **options,
        )

    @staticmethod
    def _loader(batches: list[Any]) -> DataLoader:
        # batch_size=None hands each prepared batch over as it is (polygons stay numpy arrays)
        return DataLoader(batches, batch_size=None, collate_fn=lambda batch: batch)

    def step_gradients(
        self,
        make_module: Callable[[], OOMResilientModule],
        batch: Any,
        *,
        train_above: int | None = None,
    ) -> tuple[dict[str, torch.Tensor], OOMResilientModule]:
        """The gradients of one training step over ``batch``; with ``train_above``, every
        micro-batch of more samples runs out of memory (injected)."""
        module = make_module()
        capture = _GradientCapture()
        callbacks: list[L.Callback] = [capture, OOMFaultInjection(oom_train_above=train_above)]
        trainer = self._trainer(callbacks, max_steps=1, limit_val_batches=0)
        trainer.fit(module, train_dataloaders=self._loader([batch]))
        assert capture.gradients, "the step produced no gradients"
        return capture.gradients, module

    def validation_metrics(
        self,
        make_module: Callable[[], OOMResilientModule],
        batches: list[Any],
        *,
        val_above: int | None = None,
    ) -> tuple[dict[str, float], OOMResilientModule]:
        """What ``trainer.validate`` reports over ``batches``, with an injected OOM above
        ``val_above`` samples."""
        module = make_module()
        trainer = self._trainer([OOMFaultInjection(oom_val_above=val_above)])
        (metrics,) = trainer.validate(module, dataloaders=self._loader(batches), verbose=False)
        return metrics, module

    @staticmethod
    def assert_same_gradients(
        recovered: dict[str, torch.Tensor], reference: dict[str, torch.Tensor], *, rtol: float
    ) -> None:
        """Every parameter's gradient agrees within ``rtol`` of the largest reference gradient
        entry (float32 sums taken in another order differ by a few ulps of the largest terms)."""
        assert recovered.keys() == reference.keys()
        scale = max(float(g.abs().max()) for g in reference.values())
        assert scale > 0
        for name, expected in reference.items():
            torch.testing.assert_close(
                recovered[name], expected, rtol=0, atol=rtol * scale, msg=name
            )

    @staticmethod
    def largest_gradient_difference(
        first: dict[str, torch.Tensor], second: dict[str, torch.Tensor]
    ) -> float:
        """The largest difference between two sets of gradients, relative to the largest entry."""
        scale = max(float(g.abs().max()) for g in second.values())
        return max(float((first[name] - second[name]).abs().max()) for name in second) / scale


@pytest.fixture
def oom_rehearsal(tmp_path: Path) -> OOMRehearsal:
    """Runs one training step or one validation of a module with and without injected OOMs."""
    return OOMRehearsal(tmp_path)
