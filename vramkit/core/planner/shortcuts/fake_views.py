"""View ops on fake tensors, made by their meta kernel directly.

A view (`view`, `t`, `transpose`, `slice`, `detach`, …) allocates nothing: its output shares
the input's storage. Through `FakeTensorMode` each one still costs a full dispatch, cache key
and all (0.26-0.29 ms per call on this project's 2-core machine, 0.96 ms for `_unsafe_view`,
which the fake mode's cache refuses); a Phi-1.5 plan runs about 44,000 of them. This module runs
the op's meta kernel on the fake input and wraps the result as the fake mode itself does on a
cache miss (`FakeTensorMode._dispatch_impl`: the kernel under `in_kernel_invocation_manager`,
the meta output wrapped with the input's fake device), without the cache bookkeeping. It takes
only calls whose one tensor argument is a plain fake tensor without a constant, so the fake
mode's constant propagation and device checks have nothing to do.
"""

from __future__ import annotations

from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor, in_kernel_invocation_manager

aten = torch.ops.aten

VIEW_OPS = frozenset(
    {
        aten.view.default,
        aten._unsafe_view.default,
        aten.t.default,
        aten.transpose.int,
        aten.permute.default,
        aten.slice.Tensor,
        aten.select.int,
        aten.unsqueeze.default,
        aten.squeeze.dim,
        aten.expand.default,
        aten.detach.default,
        aten.alias.default,
    }
)
"""Ops whose output shares the storage of their one tensor argument (a view, or `_unsafe_view`)."""


def takes_fast_view(func: Any, args: tuple, kwargs: dict) -> bool:
    """Whether `func(*args, **kwargs)` is a view of one plain fake tensor (no constant)."""
    if func not in VIEW_OPS or kwargs:
        return False
    source = args[0]
    return type(source) is FakeTensor and source.constant is None


def fake_view(func: Any, args: tuple) -> FakeTensor:
    """The fake view `func(*args)`: the meta kernel's output, wrapped on the input's device."""
    source = args[0]
    fake_mode = source.fake_mode
    with in_kernel_invocation_manager(fake_mode):
        meta = func(*args)
    return FakeTensor(fake_mode, meta, source.fake_device)
