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

from vramkit.core.config.settings import Settings


class ActivationOffloadSettings(Settings):
    """The keys of ``callbacks.activation_offload`` (conf/callbacks/activation_offload.yaml)."""

    enabled: bool = False
    """Offload what the forward pass saves for backward to host memory."""
    pin_memory: bool = True
    """Pinned host copies (faster, asynchronous); ignored without CUDA."""


class ActivationOffload(L.Callback):
    """Enter ``save_on_cpu`` before each training batch's forward, leave it before backward.

    ``enabled`` switches it on; ``pin_memory`` pins the host copies (faster, asynchronous copies;
    ignored without CUDA, where there is nothing to pin for). Its keys are the fields of
    `ActivationOffloadSettings`, kept validated in ``self.settings``.
    """

    settings_class = ActivationOffloadSettings

    def __init__(self, **settings: Any) -> None:
        self.settings = ActivationOffloadSettings.for_component(type(self), settings)
        self.enabled = self.settings.enabled
        self.pin_memory = self.settings.pin_memory
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
