"""A training loader that a checkpoint can stop and restart at any batch.

Lightning saves the ``state_dict()`` of every training loader that has one into the checkpoint
(``fit_loop.state_dict()["combined_loader"]``) and hands it back to ``load_state_dict()`` before
the resumed run iterates (``lightning/pytorch/loops/fit_loop.py``, ``_FitLoop.setup_data`` and
``on_save_checkpoint``). :class:`ResumableDataLoader` provides that pair: its state is the order
seed, the epoch and the number of batches handed out in it, which is all a continuation needs
because its :class:`ResumableOrder` (:class:`EpochOrder` over samples, or a task's batch sampler
such as SAGE's length buckets) makes the order of every epoch a function of (seed, epoch) and
:class:`~vramkit.core.data.sample_seeds.SeededSamples` makes every sample's augmentation a
function of (seed, epoch, index). Lightning's training fetcher does not read ahead of a loader
whose length is known (``lightning/pytorch/loops/fetchers.py``), so the batches handed out are
exactly the batches trained on.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator
from typing import Any, Protocol, runtime_checkable

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler

from vramkit.core.data.sample_seeds import SampleKey, mixed_seed

log = logging.getLogger(__name__)


@runtime_checkable
class ResumableOrder(Protocol):
    """A sampler (of samples or of whole batches) whose order is a function of (seed, epoch) and
    whose next pass can start part-way: what :class:`ResumableDataLoader` needs to continue an
    epoch at its next batch."""

    seed: int
    epoch: int

    def set_epoch(self, epoch: int) -> None:
        """Use the order of ``epoch`` from the next pass on."""

    def start_next_pass_at(self, position: int) -> None:
        """Skip the first ``position`` items (samples, or batches for a batch sampler) of the
        next pass only."""


class EpochOrder(DistributedSampler):
    """Each of ``size`` samples once per epoch, as :class:`SampleKey` (index and sample seed).

    The order is a permutation drawn from (``seed``, epoch) when ``shuffle``, else 0..size-1.
    Lightning calls :meth:`set_epoch` before each epoch (``_set_sampler_epoch``). It draws from
    no global generator, so building or iterating it changes no other random numbers of the run.

    Under data-parallel training (``num_replicas`` processes; by default those of the initialised
    process group) process ``rank`` takes every ``num_replicas``-th sample of that one order,
    starting at its rank, as ``DistributedSampler`` does: batch ``k`` of every process together
    is batch ``k`` of one process with a ``num_replicas`` times larger batch, with the same
    samples and the same augmentation (the sample seed does not depend on the process). Being a
    ``DistributedSampler`` keeps Lightning from wrapping it in its own sampler (see
    ``_requires_distributed_sampler``, ``lightning/pytorch/trainer/connectors/data_connector.py``)
    whose second shuffle would give the processes another global batch than one process reads.
    An order that does not divide evenly is padded with its first samples, as there.
    """

    def __init__(
        self,
        size: int,
        *,
        seed: int,
        shuffle: bool = True,
        num_replicas: int | None = None,
        rank: int | None = None,
    ) -> None:
        if size < 0:
            raise ValueError(f"size must be >= 0, got {size}")
        if num_replicas is None or rank is None:
            initialised = dist.is_available() and dist.is_initialized()
            num_replicas = num_replicas or (dist.get_world_size() if initialised else 1)
            rank = rank if rank is not None else (dist.get_rank() if initialised else 0)
        super().__init__(
            range(size), num_replicas=num_replicas, rank=rank, shuffle=shuffle, seed=seed
        )
        self.size = size
        self._start = 0  # position the next pass starts at (a resumed epoch)

    def set_epoch(self, epoch: int) -> None:
        """Use the order of ``epoch`` from the next pass on."""
        self.epoch = epoch

    def start_next_pass_at(self, position: int) -> None:
        """Skip the first ``position`` samples of this process's share of the next pass only."""
        self._start = position

    def order(self, epoch: int) -> list[int]:
        """The sample indices of ``epoch`` in the order they are visited (all processes)."""
        if not self.shuffle:
            return list(range(self.size))
        generator = torch.Generator().manual_seed(mixed_seed(self.seed, epoch))
        return torch.randperm(self.size, generator=generator).tolist()

    def share(self, epoch: int) -> list[int]:
        """This process's indices of ``epoch``, in order."""
        order = self.order(epoch)
        if self.num_replicas == 1:
            return order
        padding = self.total_size - len(order)
        if padding > 0:
            order += (order * math.ceil(padding / max(len(order), 1)))[:padding]
        return order[self.rank : self.total_size : self.num_replicas]

    def __len__(self) -> int:
        return self.num_samples

    def __iter__(self) -> Iterator[SampleKey]:
        epoch, start = self.epoch, self._start
        self._start = 0
        for index in self.share(epoch)[start:]:
            yield SampleKey(index, mixed_seed(self.seed, epoch, index))


class ResumableDataLoader(DataLoader):
    """A ``DataLoader`` whose position is saved with the checkpoint: over a
    :class:`ResumableOrder` ``sampler`` (usually :class:`EpochOrder`) with a ``batch_size``, or a
    :class:`ResumableOrder` ``batch_sampler``.

    Its ``__init__`` is DataLoader's own, so Lightning can re-create it with another sampler
    (it does not for an :class:`EpochOrder`, which shards itself under DDP and keeps its
    position there too); with a sampler that is not a :class:`ResumableOrder` its state is
    empty and a resumed epoch starts from its first batch, as a plain DataLoader would. A
    position is counted in this process's share: resume with the number of processes that
    saved it.
    """

    _batches_done = 0  # batches handed out in the current pass
    _resume: tuple[int, int] | None = None  # (epoch, batches done) read from a checkpoint

    def _order(self) -> tuple[ResumableOrder, int] | None:
        """The resumable order and how many of its items make one batch (None: none)."""
        if self.batch_size is None and isinstance(self.batch_sampler, ResumableOrder):
            return self.batch_sampler, 1
        if isinstance(self.sampler, ResumableOrder):
            return self.sampler, self.batch_size or 1
        return None

    def state_dict(self) -> dict[str, Any]:
        """The order seed, the epoch and the batches of it handed out so far."""
        order = self._order()
        if order is None:
            return {}
        return {
            "order_seed": order[0].seed,
            "epoch": order[0].epoch,
            "batches_done": self._batches_done,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Continue the saved epoch at its next batch (once Lightning sets that epoch again)."""
        if not state_dict:
            return
        order = self._order()
        if order is None:
            log.warning(
                "the checkpoint holds a loader position, but this loader's sampler is a %s: "
                "the resumed epoch starts from its first batch",
                type(self.sampler).__name__,
            )
            return
        order[0].seed = int(state_dict["order_seed"])
        order[0].set_epoch(int(state_dict["epoch"]))
        self._resume = (int(state_dict["epoch"]), int(state_dict["batches_done"]))

    def __iter__(self) -> Iterator[Any]:
        # A generator: nothing is read before the first batch is asked for, which Lightning does
        # after it has set the epoch, so a position saved at the end of an epoch (Lightning then
        # sets the next epoch) is dropped, and one saved inside the epoch is used.
        skip = 0
        order = self._order()
        if self._resume is not None and order is not None:
            epoch, batches_done = self._resume
            if epoch == order[0].epoch and batches_done < len(self):
                skip = batches_done
                order[0].start_next_pass_at(skip * order[1])
        self._resume = None
        self._batches_done = skip
        for batch in super().__iter__():
            self._batches_done += 1
            yield batch
