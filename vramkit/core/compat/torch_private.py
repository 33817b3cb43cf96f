"""torch's private names that vramkit uses outside the planner, each behind one name here.

Checked on torch 2.13.0 (``pyproject.toml`` admits ``>=2.13,<2.15``; CI also runs 2.14.1); every
name here has a test in ``tests/core/compat/test_torch_private.py``. The kernels are bound to
names of this module, not wrapped in functions: the finite guard calls them on every training
step, where a wrapper's frame would be paid each time (``vramkit/core/callbacks/finite_guard.py``).
The planner's own use of torch internals is checked apart (``vramkit/core/planner/cuda``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_flatten

BatchNormBase = nn.modules.batchnorm._BatchNorm
"""The base class of ``nn.BatchNorm1d/2d/3d`` and ``nn.SyncBatchNorm`` (running statistics,
``_check_input_dim``): ``torch.nn.modules.batchnorm._BatchNorm``. Checked on torch 2.13.0."""

group_tensors_by_device_and_dtype = torch._C._group_tensors_by_device_and_dtype
"""``(tensorlists, with_indices) -> {(device, dtype): (tensorlists, indices)}``, the grouping of
torch's foreach optimizers, called in C++ without the ``@no_grad()`` wrapper of
``torch.utils._foreach_utils._group_tensors_by_device_and_dtype``:
``torch._C._group_tensors_by_device_and_dtype``. Checked on torch 2.13.0."""

non_finite_check_and_unscale_ = torch._amp_foreach_non_finite_check_and_unscale_
"""``(tensors, found_inf, inv_scale)``: multiply ``tensors`` (one device and dtype) by
``inv_scale`` in place and set ``found_inf`` to 1 if any element is NaN or inf, GradScaler's
fused kernel (torch/amp/grad_scaler.py, ``_unscale_grads_``):
``torch._amp_foreach_non_finite_check_and_unscale_``. Checked on torch 2.13.0."""


def foreach_max_norm(tensors: list[torch.Tensor]) -> tuple[torch.Tensor, ...]:
    """The largest magnitude of each tensor of ``tensors`` (NaN where it holds one), as one
    fused kernel per device and dtype: ``torch._foreach_norm(tensors, inf)``. Checked on
    torch 2.13.0."""
    return torch._foreach_norm(tensors, float("inf"))


def tree_leaves(tree: Any) -> list[Any]:
    """The leaves of a nested structure of lists, tuples and dicts (a trainer's loaders), in
    order: ``torch.utils._pytree.tree_flatten(tree)[0]``, the flattening Lightning applies to
    its combined loaders. Checked on torch 2.13.0."""
    return tree_flatten(tree)[0]


def is_compiled(module: nn.Module) -> bool:
    """Whether ``module`` runs through ``torch.compile``: a wrapper made by
    ``torch.compile(module)`` (``torch._dynamo.eval_frame.OptimizedModule``) or a module compiled
    in place by ``module.compile()`` (it sets ``nn.Module._compiled_call_impl``). Checked on
    torch 2.13.0."""
    # Imported here: torch._dynamo takes seconds to import, which a caller without Lightning
    # (Lightning imports it anyway) need not pay for a question about compiled modules.
    from torch._dynamo.eval_frame import OptimizedModule

    return (
        isinstance(module, OptimizedModule)
        or getattr(module, "_compiled_call_impl", None) is not None
    )
