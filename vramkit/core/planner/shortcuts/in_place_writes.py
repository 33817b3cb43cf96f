"""In-place ops that only write values: on fake tensors there is nothing to run.

An op like `add_`, `relu_` or the optimizers' `_foreach_addcdiv_` writes new values into
tensors it was given: no storage is allocated or freed, and no shape, stride or dtype changes
(autograd has already bumped the version counters before the dispatch mode sees the op). A fake
tensor has no values, so running such an op through `FakeTensorMode` changes nothing the planner
records, yet it costs the full fake dispatch: its cache key walks every tensor argument, which
for a `foreach` op of an optimizer step is every parameter (measured on the Phi-1.5 plan: 4.3 s
of its CPU time went to the in-place `foreach` ops of AdamW, 13-106 ms per call).

Left to the fake mode, because their effect is not only values:
- ops tagged `inplace_view` (`t_`, `squeeze_`, `as_strided_`, `resize_`, `set_`, `detach_`): they
  change metadata or storage;
- ops that write an `out=` argument (they may resize it) or return a fresh tensor;
- calls where a tensor argument is not a plain fake tensor, or is a fake tensor that carries a
  constant: the fake mode propagates constants (Adam's step counters are such constants, and
  their values feed the bias correction the step computes on the host).
"""

from __future__ import annotations

from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._pytree import tree_flatten

_WRITES_VALUES_ONLY: dict[Any, tuple[int, ...] | None] = {}
"""OpOverload → for each return, the index of the argument it aliases (None: not such an op)."""


def _returned_arguments(func: Any) -> tuple[int, ...] | None:
    """The argument index behind each return of an op that only writes values in place, or None
    when `func` is not such an op."""
    schema = func._schema
    if not schema.is_mutable or torch.Tag.inplace_view in func.tags:
        return None
    written = {}
    for index, argument in enumerate(schema.arguments):
        alias = argument.alias_info
        if alias is None:
            continue
        if not alias.is_write or argument.kwarg_only or argument.name == "out":
            return None
        written.update(dict.fromkeys(alias.before_set, index))
    returned = []
    for result in schema.returns:
        alias = result.alias_info
        if alias is None or not alias.is_write or len(alias.before_set) != 1:
            return None  # a fresh output: the op allocates
        (alias_set,) = alias.before_set
        if alias_set not in written:
            return None
        returned.append(written[alias_set])
    return tuple(returned)


def writes_values_only(func: Any, args: tuple, kwargs: dict) -> bool:
    """Whether `func(*args, **kwargs)` only writes values into plain fake tensors it was given."""
    if func not in _WRITES_VALUES_ONLY:
        _WRITES_VALUES_ONLY[func] = _returned_arguments(func)
    if _WRITES_VALUES_ONLY[func] is None:
        return False
    for value in tree_flatten((args, kwargs))[0]:
        if isinstance(value, torch.Tensor) and (
            type(value) is not FakeTensor or value.constant is not None
        ):
            return False
    return True


def written_result(func: Any, args: tuple) -> Any:
    """What `func` returns without running: the tensors it wrote into (None for none)."""
    returned = _WRITES_VALUES_ONLY[func]
    if not returned:
        return None
    if len(returned) == 1:
        return args[returned[0]]
    return tuple(args[index] for index in returned)
