"""The finite guard's per-step gradient check costs the same Python work whatever the model's
size: no bytecode runs per parameter tensor (issue 36: the safety's cost flat in model size)."""

from __future__ import annotations

import math

import torch

from tests.bytecode_count import bytecodes
from vramkit.core.callbacks.finite_guard import all_finite, gradients_of


def _optimizer(tensors: int) -> torch.optim.Optimizer:
    params = [torch.nn.Parameter(torch.ones(2)) for _ in range(tensors)]
    for param in params[::2]:  # every other one has a gradient, as frozen layers leave it
        param.grad = torch.ones(2)
    half = tensors // 2
    return torch.optim.SGD([{"params": params[:half]}, {"params": params[half:]}], lr=0.1)


def _check(optimizer: torch.optim.Optimizer) -> bool:
    return all_finite(gradients_of(optimizer))


def test_the_gradient_check_runs_no_bytecode_per_parameter_tensor() -> None:
    small, large = _optimizer(4), _optimizer(600)
    _check(small), _check(large)  # first calls: lazy imports and caches
    assert bytecodes(lambda: _check(large)) == bytecodes(lambda: _check(small))


def test_the_gathered_gradients_are_those_set_in_order_and_a_nan_is_found() -> None:
    optimizer = _optimizer(6)
    params = [p for group in optimizer.param_groups for p in group["params"]]
    assert [id(g) for g in gradients_of(optimizer)] == [id(p.grad) for p in params[::2]]
    assert _check(optimizer)
    params[4].grad[1] = math.nan
    assert not _check(optimizer)
    assert all_finite([])
