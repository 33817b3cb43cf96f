"""Sums over every process of a run, with gradients, so a batch-pooled quantity (a loss that
divides sums over the batch, BatchNorm statistics) is pooled over the global batch.

Why gradients flow as they should: every process computes the same pooled value ``f(S)`` of the
summed ``S = sum_r s_r``. The backward of the sum all-reduces the incoming gradient (as
``_AllReduce`` in ``torch/distributed/nn/functional.py`` does; that one warns that it is
deprecated on every call, so the same two lines live here in :class:`_SumOverProcesses`), so
process ``r`` receives ``P * df/dS`` for its ``s_r``; DDP then averages the parameter gradients
over the ``P`` processes (``torch/nn/parallel/distributed.py``), which leaves
``sum_r ds_r/dθ * df/dS``: the gradient of one process computing ``f`` on the whole global batch.
With one process (or no process group) every function here is the identity.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor


def process_count() -> int:
    """Processes of the default group; 1 without an initialised one (a plain run, a trace)."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    return 1


def sum_over_processes(tensor: Tensor) -> Tensor:
    """``tensor`` summed over every process (same shape), differentiable as explained above."""
    if process_count() == 1:
        return tensor
    return _SumOverProcesses.apply(tensor)


class _SumOverProcesses(torch.autograd.Function):
    @staticmethod
    def forward(ctx: object, tensor: Tensor) -> Tensor:
        total = tensor.clone()
        dist.all_reduce(total, op=dist.ReduceOp.SUM)
        return total

    @staticmethod
    def backward(ctx: object, grad: Tensor) -> Tensor:
        total = grad.clone()
        dist.all_reduce(total, op=dist.ReduceOp.SUM)
        return total


def sum_of_largest_over_processes(values: Tensor, count: int) -> Tensor:
    """This process's share of the sum of the ``count`` largest ``values`` of all processes.

    The ``count`` largest of all processes are among each process's own ``count`` largest, so
    those (detached, padded with -inf to one length) are gathered to find the global
    ``count``-th largest value; :func:`share_of_largest` does the rest.
    """
    processes = process_count()
    if count <= 0 or processes == 1:
        own = torch.topk(values.detach(), min(max(count, 1), values.numel())).values
        return share_of_largest(values, count, own[-1], across=False)
    own = torch.topk(values.detach(), min(count, values.numel())).values
    padded = torch.full((count,), float("-inf"), dtype=values.dtype, device=values.device)
    padded[: own.numel()] = own
    gathered = [torch.empty_like(padded) for _ in range(processes)]
    dist.all_gather(gathered, padded)
    threshold = torch.topk(torch.cat(gathered), count).values[-1]
    return share_of_largest(values, count, threshold, across=True)


def share_of_largest(
    values: Tensor, count: int | Tensor, threshold: Tensor, *, across: bool
) -> Tensor:
    """The sum of the ``count`` largest ``values`` given the ``count``-th largest, ``threshold``;
    with ``across``, this process's share of that sum over every process's ``values``.

    Values tied with ``threshold`` share the places left after those above it, equally: the sum
    is the one ``topk`` gives, and so is its gradient except that it is spread over every tied
    value instead of going to the ones ``topk`` happens to pick. That pick depends on the device
    and on how the values are split between processes; tie sharing does not, so one process and
    several compute the same gradient. Ties are common: padding makes regions of identical pixels.
    """
    greater = values > threshold
    tied = values == threshold
    counts = torch.stack([greater.sum(), tied.sum()])
    if across:
        counts = sum_over_processes(counts)
    places = (count - counts[0]).to(values.dtype) / counts[1].clamp(min=1).to(values.dtype)
    return (values * greater).sum() + places * (values * tied).sum()
