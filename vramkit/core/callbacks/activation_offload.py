"""Keep the tensors autograd saves for backward in host memory (``callbacks.activation_offload``).

While a training step's forward pass runs, `torch.autograd.graph.save_on_cpu` copies every tensor
saved for backward to (pinned) host memory and copies it back when backward needs it
(torch/autograd/graph.py, ``save_on_cpu``): device memory then holds about one layer's saved
tensors at a time instead of the whole network's, at the cost of two PCIe copies per saved
tensor. The memory planner plans it with `RunSetup.activation_offload`.
"""

from __future__ import annotations

from typing import Any

import lightning as L
import torch


class ActivationOffload(L.Callback):
    """Enter ``save_on_cpu`` before each training batch's forward, leave it before backward.

    ``enabled`` switches it on; ``pin_memory`` pins the host copies (faster, asynchronous copies;
    ignored without CUDA, where there is nothing to pin for).
    """

    def __init__(self, *, enabled: bool = False, pin_memory: bool = True) -> None:
        self.enabled = enabled
        self.pin_memory = pin_memory
        self._offloading: Any = None

    def nothing_to_do(self, trainer: L.Trainer, datamodule: Any) -> str | None:
        """Why the callback is idle ("off") or None when it offloads."""
        return None if self.enabled else "callbacks.activation_offload.enabled is false"

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self._leave()
        pin = self.pin_memory and torch.cuda.is_available()
        self._offloading = torch.autograd.graph.save_on_cpu(pin_memory=pin)
        self._offloading.__enter__()

    def on_before_backward(
        self, trainer: L.Trainer, pl_module: L.LightningModule, loss: torch.Tensor
    ) -> None:
        # Tensors saved so far stay offloaded; backward's own saves need not be.
        self._leave()

    def on_train_batch_end(self, *args: Any, **kwargs: Any) -> None:
        self._leave()

    def on_exception(self, *args: Any, **kwargs: Any) -> None:
        self._leave()

    def _leave(self) -> None:
        if self._offloading is not None:
            self._offloading.__exit__(None, None, None)
            self._offloading = None
