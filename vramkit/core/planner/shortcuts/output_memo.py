"""Fake outputs of ops met before, remade from their metadata without the fake dispatch.

What a trace still sends through `FakeTensorMode` costs 0.17-0.6 ms an op even on the mode's
own cache hit, most of it spent building that cache's key (`FakeTensorMode._cache_key`: about
twenty fields of every tensor argument, `extract_tensor_metadata`). A Phi-1.5 plan sends about
60,000 such ops through it, most of them the same matrix products, norms and activations of its
24 identical layers at the same batch size, trace after trace. This memo keys an op by what can
change its outputs within a plan: the op, the fake mode's global inputs (default dtype and
device, inference mode, grad mode) and, for every tensor argument, its shape, strides, offset,
dtype and autograd / view bits (the arguments are plain dense fake CPU tensors, so the other
fields are the same for all of them); every other argument by value. On a hit it makes each
output again, a meta tensor of the remembered shape, strides and dtype wrapped for the mode, as
the fake mode makes a hit's outputs (`FakeTensorMode._output_from_cache_entry`).

Only what is certain to come out the same is remembered: functional, non-view aten ops whose
outputs are fresh (no output shares storage with an input or with another output, each starts
its storage and fills it exactly) plain fake CPU tensors without a constant value. Ops that
mutate, view, branch on data or make constants, and calls with real tensors, fake constants or
arguments of other kinds, always go through the fake mode
(`tests/core/planner/shortcuts/test_output_memo.py` compares remade outputs with the mode's).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from vramkit.core.planner.shortcuts.fresh_outputs import new_fake, on_fake_cpu

_PLAIN_VALUES = (
    int,
    float,
    bool,
    str,
    type(None),
    torch.dtype,
    torch.device,
    torch.layout,
    torch.memory_format,
)
_NEVER = object()
"""The memo's mark for an op whose outputs it does not remember."""
_UNSAFE_TAGS = (
    torch.Tag.data_dependent_output,
    torch.Tag.dynamic_output_shape,
    torch.Tag.inplace_view,
)


def _rememberable(func: Any) -> bool:
    """Ops whose outputs follow from their arguments' metadata alone."""
    return (
        isinstance(func, torch._ops.OpOverload)
        and func.namespace == "aten"
        and not func._schema.is_mutable
        and not func.is_view
        and not any(tag in func.tags for tag in _UNSAFE_TAGS)
    )


def _tensor_key(tensor: torch.Tensor) -> tuple | None:
    if not on_fake_cpu(tensor) or tensor.layout != torch.strided:
        return None
    return (
        tensor.shape,
        tensor.stride(),
        tensor.storage_offset(),
        tensor.dtype,
        tensor.requires_grad,
        tensor.is_conj(),
        tensor.is_neg(),
    )


def _value_key(value: Any) -> Any:
    """A hashable stand-in for one argument, or `_NEVER` when it has none."""
    if isinstance(value, torch.Tensor):
        key = _tensor_key(value)
        return _NEVER if key is None else key
    if isinstance(value, (list, tuple)):
        keys = tuple(_value_key(item) for item in value)
        return _NEVER if any(key is _NEVER for key in keys) else (type(value), keys)
    if isinstance(value, _PLAIN_VALUES):
        return (type(value), value)  # 1 and 1.0 and True pick different overload behaviour
    return _NEVER


def _extent_bytes(tensor: torch.Tensor) -> int:
    if tensor.numel() == 0:
        return 0
    pairs = zip(tensor.shape, tensor.stride(), strict=True)
    span = 1 + sum((size - 1) * stride for size, stride in pairs)
    return span * tensor.element_size()


def _fresh_spec(outputs: list[Any], inputs: list[torch.Tensor]) -> tuple | None:
    """(shape, strides, dtype) of each output (None stays None), or None when any output is
    not a fresh plain fake CPU tensor that starts and fills its own storage."""
    seen = {tensor.untyped_storage()._cdata for tensor in inputs}
    spec = []
    for output in outputs:
        if output is None:
            spec.append(None)
            continue
        key = _tensor_key(output)
        if key is None:
            return None
        _shape, _strides, offset, _dtype, *bits = key  # bits: requires_grad, conj, neg
        if offset or any(bits):
            return None
        storage = output.untyped_storage()
        if storage._cdata in seen or storage.nbytes() != _extent_bytes(output):
            return None
        seen.add(storage._cdata)
        spec.append((tuple(output.shape), output.stride(), output.dtype))
    return tuple(spec)


class OutputMemo:
    """Remembers fresh fake outputs by op and argument metadata (see the module docstring).

    One memo may serve every trace of a plan: it holds metadata, never tensors.
    """

    def __init__(self) -> None:
        self._outputs: dict[tuple, tuple | object] = {}
        self._rememberable: dict[Any, bool] = {}
        self.hits = 0
        """Outputs remade without the fake dispatch."""

    def run(self, func: Any, args: tuple, kwargs: dict, dispatch: Callable[[], Any]) -> Any:
        """`func`'s outputs for `args` / `kwargs`: remade when met before, else `dispatch()`'s
        (remembered when they can be)."""
        key = self._key(func, args, kwargs)
        if key is None:
            return dispatch()
        spec = self._outputs.get(key)
        if spec is _NEVER:
            return dispatch()
        if spec is not None:
            mode = torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE)
            if mode is not None:
                self.hits += 1
                return _remade(spec, mode)
        out = dispatch()
        self._outputs[key] = _output_spec(out, args, kwargs)
        return out

    def _key(self, func: Any, args: tuple, kwargs: dict) -> tuple | None:
        rememberable = self._rememberable.get(func)
        if rememberable is None:
            rememberable = self._rememberable[func] = _rememberable(func)
        if not rememberable:
            return None
        arguments = _value_key(args)
        if arguments is _NEVER:
            return None
        keywords = _value_key(tuple(sorted(kwargs.items()))) if kwargs else ()
        if keywords is _NEVER:
            return None
        return (
            func,
            torch.get_default_dtype(),
            torch._C._get_default_device(),
            torch.is_inference_mode_enabled(),
            torch.is_grad_enabled(),
            arguments,
            keywords,
        )


def _output_spec(out: Any, args: tuple, kwargs: dict) -> tuple | object:
    inputs = [
        value
        for value in torch.utils._pytree.tree_leaves((args, kwargs))
        if isinstance(value, torch.Tensor)
    ]
    if isinstance(out, torch.Tensor):
        spec = _fresh_spec([out], inputs)
        return _NEVER if spec is None else (False, spec)
    if isinstance(out, tuple) and all(o is None or isinstance(o, torch.Tensor) for o in out):
        spec = _fresh_spec(list(out), inputs)
        return _NEVER if spec is None else (True, spec)
    return _NEVER


def _remade(spec: tuple, mode: FakeTensorMode) -> Any:
    several, outputs = spec
    cpu = torch.device("cpu")
    made = [None if output is None else new_fake(mode, cpu, *output) for output in outputs]
    return tuple(made) if several else made[0]
