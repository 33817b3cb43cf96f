"""Fake constants (`torch.tensor(number)` inside a trace) made without the fake dispatch.

`torch.tensor(0.0)` reaches the fake mode as `lift_fresh` of a real one-element tensor, and the
fake mode keeps a copy as the fake tensor's `constant`, which `.item()` and constant propagation
read (`FakeTensorMode._dispatch_impl`, the lift branch, then
`FakeTensorConverter.from_real_tensor(make_constant=True)`). Adam(W) makes one such step counter
per parameter when it builds its state: 351 in a default plan and thousands in a Phi-1.5 plan,
0.55 ms each through the dispatch and the meta converter. The same fake constant is made here
in about 40 µs: a meta tensor of the copy's layout, wrapped for the running fake mode with the
copy as its constant, and registered as the meta converter registers it: in its memo (a write
to the constant returns the same fake tensor) and its constant-storage map (a write to an alias
invalidates the constant). Only the case the fake mode turns into a constant is
answered (a plain dense CPU tensor of one element, `FakeTensorMode.may_turn_const`); anything
else goes through the fake mode
(`tests/core/planner/shortcuts/test_fake_constants.py` compares the two).
"""

from __future__ import annotations

from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._mode_utils import no_dispatch

from vramkit.core.planner.shortcuts.fresh_outputs import new_fake

_LIFTS = {torch.ops.aten.lift_fresh.default}


def lifted_constant(func: Any, args: tuple, kwargs: dict) -> FakeTensor | None:
    """The fake constant the running fake mode would make of `lift_fresh(args[0])`, or None
    when the fake mode must answer."""
    if func not in _LIFTS or len(args) != 1 or kwargs:
        return None
    real = args[0]
    if (
        type(real) is not torch.Tensor
        or real.numel() != 1
        or real.layout != torch.strided
        or real.device.type != "cpu"
        or real.requires_grad
        or real.is_quantized
        or real.is_conj()
        or real.is_neg()
    ):
        return None
    mode = torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE)
    if mode is None:
        return None
    with no_dispatch():
        constant = real.clone()
    fake = new_fake(
        mode, constant.device, constant.shape, constant.stride(), constant.dtype, constant=constant
    )
    converter = mode.fake_tensor_converter
    # An in-place write to a constant runs on the copy, and the converter finds the copy's fake
    # by this memo: the write returns the same fake tensor, as `x += 1` must.
    converter.set_tensor_memo(constant, fake)
    converter.add_constant_storage_mapping(fake)
    return fake
