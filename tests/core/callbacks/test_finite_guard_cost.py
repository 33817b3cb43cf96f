"""The finite guard's per-step gradient check costs the same Python work whatever the model's
size: no bytecode runs per parameter tensor (issue 36: the safety's cost flat in model size)."""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from types import FrameType
from typing import Any

import torch

from vramkit.core.callbacks.finite_guard import all_finite, gradients_of


def _bytecodes(call: Callable[[], Any]) -> int:
    """Python bytecodes ``call`` runs (opcode tracing: the same count on a busy machine)."""
    count = 0

    def local(frame: FrameType, event: str, arg: Any) -> Any:
        nonlocal count
        if event == "opcode":
            count += 1
        return local

    def start(frame: FrameType, event: str, arg: Any) -> Any:
        frame.f_trace_opcodes = True
        return local

    sys.settrace(start)
    try:
        call()
    finally:
        sys.settrace(None)
    return count


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
    assert _bytecodes(lambda: _check(large)) == _bytecodes(lambda: _check(small))


def test_the_gathered_gradients_are_those_set_in_order_and_a_nan_is_found() -> None:
    optimizer = _optimizer(6)
    params = [p for group in optimizer.param_groups for p in group["params"]]
    assert [id(g) for g in gradients_of(optimizer)] == [id(p.grad) for p in params[::2]]
    assert _check(optimizer)
    params[4].grad[1] = math.nan
    assert not _check(optimizer)
    assert all_finite([])
