"""Which parameters already received their gradient when a backward pass was interrupted."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import torch
from torch.utils.hooks import RemovableHandle


class GradArrivals:
    """Notes every parameter whose ``.grad`` was accumulated during the current backward pass.

    Autograd accumulates a leaf's gradient once per backward pass, with the sum of all its
    uses, so after an out-of-memory error in the middle of a backward pass each parameter
    either holds this micro-batch's full contribution or none of it. A redo that leaves out
    the parameters listed here (see :meth:`frozen`) adds every sample's gradient exactly once.
    """

    def __init__(self, parameters: Iterable[torch.nn.Parameter]) -> None:
        self._parameters = [p for p in parameters if p.requires_grad]
        self._arrived: dict[int, torch.nn.Parameter] = {}
        self._handles: list[RemovableHandle] = []

    @contextmanager
    def watching(self) -> Iterator[GradArrivals]:
        """Install the hooks for the duration of a guarded step."""
        self._handles = [p.register_post_accumulate_grad_hook(self._note) for p in self._parameters]
        try:
            yield self
        finally:
            for handle in self._handles:
                handle.remove()
            self._handles = []

    def _note(self, parameter: torch.Tensor) -> None:
        self._arrived[id(parameter)] = parameter

    def reset(self) -> None:
        """Start a new micro-batch: nothing has arrived yet."""
        self._arrived = {}

    def arrived(self) -> dict[int, torch.nn.Parameter]:
        """The parameters that received their gradient since the last :meth:`reset`, by id."""
        return dict(self._arrived)

    @staticmethod
    @contextmanager
    def frozen(parameters: Iterable[torch.nn.Parameter]) -> Iterator[None]:
        """Exclude ``parameters`` from the gradient computation, then restore them."""
        frozen = [p for p in parameters if p.requires_grad]
        for p in frozen:
            p.requires_grad_(False)
        try:
            yield
        finally:
            for p in frozen:
                p.requires_grad_(True)
