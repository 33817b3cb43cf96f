"""A second forward of the same batch with noisy token embeddings and the first one's dropout masks.

Dropout draws its masks from the global generators (the CPU one, and the device's for CUDA
tensors: ``torch.cuda.get_rng_state`` holds the Philox seed and offset the fused dropout kernel
reads, see ``torch/cuda/random.py``). Restoring their state before the second forward makes it
draw the same masks in the same order, as long as both forwards run the same ops on the same
shapes, which they do: only the embedding values differ. The embedding noise comes from a
generator of its own, so drawing it does not move the global ones.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn


class GeneratorSnapshot:
    """The state of the global generators that dropout on ``device`` draws from."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.cpu = torch.get_rng_state()
        self.cuda = torch.cuda.get_rng_state(device) if device.type == "cuda" else None

    def restore(self) -> None:
        """Put the generators back where they were when the snapshot was taken."""
        torch.set_rng_state(self.cpu)
        if self.cuda is not None:
            torch.cuda.set_rng_state(self.cuda, self.device)


@contextmanager
def embedding_noise(
    embedding: nn.Module, relative_std: float, generator: torch.Generator
) -> Iterator[None]:
    """While active, ``embedding``'s output gets Gaussian noise of std ``relative_std`` × its
    root-mean-square (so the noise scale follows the embeddings', whatever their init)."""

    def add_noise(module: nn.Module, inputs: Any, output: torch.Tensor) -> torch.Tensor:
        scale = output.detach().float().pow(2).mean().sqrt() * relative_std
        noise = torch.randn(
            output.shape, generator=generator, device=output.device, dtype=torch.float32
        )
        return output + (noise * scale).to(output.dtype)

    handle = embedding.register_forward_hook(add_noise)
    try:
        yield
    finally:
        handle.remove()


class NoisyForward:
    """Runs a forward whose dropout masks a later noisy forward replays.

    ``prepare(device, step)`` seeds the noise and snapshots the generators; the caller then runs
    its clean forward; ``run(forward)`` restores the snapshot and runs ``forward`` with noise on
    the token embeddings.
    """

    def __init__(self, embedding: nn.Module, relative_std: float) -> None:
        self.embedding = embedding
        self.relative_std = relative_std
        # Drawn once, from Python's generator (seeded by seed_everything; a torch draw would be a
        # meta tensor when the planner builds the module): seeded runs repeat their noise. Per step
        # the seed is derived, not drawn: a draw read back as a number is a data-dependent
        # branch the memory planner's fake tensors cannot answer.
        self._base_seed = random.randrange(2**31)
        self._snapshot: GeneratorSnapshot | None = None
        self._generator: torch.Generator | None = None

    def prepare(self, device: torch.device, step: tuple[int, ...]) -> None:
        """Seed the noise from ``step`` (e.g. global step and batch index; equal steps get equal
        noise), then snapshot the global generators."""
        seed = hash((self._base_seed, *step)) % 2**62
        self._generator = torch.Generator(device=device)
        self._generator.manual_seed(seed)
        self._snapshot = GeneratorSnapshot(device)

    def run(self, forward: Callable[[], torch.Tensor]) -> torch.Tensor:
        """``forward()`` under the clean forward's dropout masks, with noisy embeddings."""
        if self._snapshot is None or self._generator is None:
            raise RuntimeError("call prepare() before the clean forward")
        snapshot, generator = self._snapshot, self._generator
        self._snapshot = self._generator = None
        snapshot.restore()
        with embedding_noise(self.embedding, self.relative_std, generator):
            return forward()
