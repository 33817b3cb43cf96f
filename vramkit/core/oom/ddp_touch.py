"""Start DDP's gradient all-reduce for gradients that were accumulated without it."""

from __future__ import annotations

from collections.abc import Sequence

import torch


class _TouchEveryParameter(torch.autograd.Function):
    """A zero that depends on every parameter and passes no gradient back to any of them.

    Its backward pass reaches each parameter's gradient accumulator with an undefined
    gradient: the accumulator adds nothing and allocates nothing (``AccumulateGrad::apply``
    returns early on an undefined gradient, torch/csrc/autograd/functions/accumulate_grad.cpp),
    but the autograd engine still runs its post hooks (``call_function`` in
    torch/csrc/autograd/engine.cpp), which is where DDP's reducer marks the parameter ready
    and copies its current ``.grad`` into the bucket that gets all-reduced
    (``Reducer::autograd_hook`` and ``mark_variable_ready_dense`` in
    torch/csrc/distributed/c10d/reducer.cpp).
    """

    @staticmethod
    def forward(
        ctx: torch.autograd.function.FunctionCtx, *parameters: torch.Tensor
    ) -> torch.Tensor:
        ctx.count = len(parameters)
        return parameters[0].new_zeros(())

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, grad: torch.Tensor) -> tuple[None, ...]:
        return (None,) * ctx.count


def touch_every_parameter(parameters: Sequence[torch.nn.Parameter]) -> torch.Tensor:
    """A 0-d zero whose backward pass makes DDP all-reduce the ``.grad`` of ``parameters``.

    A guarded step accumulates its gradients inside DDP's forward, where the reducer ignores
    them (it expects gradients only after ``prepare_for_backward``). Adding this zero to the
    loss Lightning backpropagates makes every parameter's hook fire once in that backward
    pass: the gradients are all-reduced as if they had been computed there, with no kernel
    per parameter and no collective of its own.
    """
    return _TouchEveryParameter.apply(*parameters)
