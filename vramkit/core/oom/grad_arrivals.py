"""Which parameters already received their gradient when a backward pass was interrupted."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import torch
from torch.utils.hooks import RemovableHandle


class GradArrivals:
    """Notes every parameter whose ``.grad`` is accumulated while its hooks are installed.

    Autograd accumulates a leaf's gradient once per backward pass, with the sum of all its
    uses, so after an out-of-memory error in the middle of a backward pass each parameter
    either holds this micro-batch's full contribution or none of it. A redo that leaves out
    the parameters listed here (see :meth:`frozen`) adds every sample's gradient exactly once.

    The hooks are installed once (:meth:`install`) and stay until :meth:`remove`: a guarded
    module keeps them for a training epoch only when its gradients can hold contributions
    that must survive a failure (gradient accumulation), as one Python call per parameter per
    backward pass costs less than installing and removing a hook per parameter every step.
    """

    def __init__(self, parameters: Iterable[torch.nn.Parameter]) -> None:
        self._parameters = [p for p in parameters if p.requires_grad]
        self._arrived: dict[int, torch.nn.Parameter] = {}
        self._handles: list[RemovableHandle] = []

    @property
    def installed(self) -> bool:
        """Whether the hooks are installed."""
        return bool(self._handles)

    def install(self) -> None:
        """Register the post-accumulate-grad hooks (nothing when they are installed already)."""
        if not self._handles:
            self._handles = [
                p.register_post_accumulate_grad_hook(self._note) for p in self._parameters
            ]

    def remove(self) -> None:
        """Remove the hooks."""
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
