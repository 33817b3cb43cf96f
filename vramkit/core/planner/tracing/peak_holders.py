"""Who holds memory at a phase's peak: the largest groups of live tensors, by module and kind.

A plan that only says "activations 9.8 GiB" leaves the user guessing; grouped by where each tensor
was made (the module running its forward, or the parameter it belongs to) and what it is for, the
peak reads "layer.*.attention.self: saved activations 6.0 GiB in 48 tensors of [8, 16, 512, 512]".
Repeated blocks fold into one row (`layer.3` and `layer.17` become `layer.*`), so a 24-layer model
shows one line per kind of block, not 24.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import nn

SAVED_ACTIVATION = "saved activation"
TEMPORARY = "temporary"
WORKSPACE = "workspace"
"""A library's scratch block, allocated and given back within one op (cuDNN convolutions)."""
BACKWARD = "(backward)"
"""Where a tensor made by autograd's backward pass, outside any forward, is said to be."""
OUTSIDE = "(step)"
"""Where a tensor the step makes outside any module (loss, optimizer, batch) is said to be."""

_INDEX = re.compile(r"(?<=\.)\d+(?=\.|$)|^\d+(?=\.|$)")


@dataclass(frozen=True)
class Holder:
    """One group of tensors live at the peak: same module group, same kind."""

    where: str
    """The module (repeated blocks folded to `*`), or `(backward)` / `(step)`."""
    kind: str
    """parameters, gradients, optimizer_state, inputs, saved activation, temporary or workspace."""
    bytes: int
    tensors: int
    largest_shape: tuple[int, ...]
    """The shape of the group's largest tensor."""
    dtype: str
    """The dtype of the group's largest tensor, e.g. float16."""


def fold_indices(path: str) -> str:
    """`encoder.layer.17.attention` → `encoder.layer.*.attention`: one row per repeated block."""
    return _INDEX.sub("*", path)


class ModuleScope:
    """The module whose forward is running, for every allocation made inside `track(root)`.

    Uses global forward hooks, so modules called directly (not through their parent's forward)
    are named too; a module outside `root` reads as its class name.
    """

    def __init__(self) -> None:
        self._names: dict[int, str] = {}
        self._stack: list[str] = []

    def current(self, *, in_backward: bool) -> str:
        """Where an allocation made now comes from."""
        if self._stack:
            return self._stack[-1]
        return BACKWARD if in_backward else OUTSIDE

    @contextlib.contextmanager
    def track(self, root: nn.Module) -> Iterator[ModuleScope]:
        """Name modules by their path in `root` while inside."""
        self._names = {id(module): fold_indices(name) for name, module in root.named_modules()}
        self._names[id(root)] = type(root).__name__

        def enter(module: nn.Module, _args: object) -> None:
            self._stack.append(self._names.get(id(module), type(module).__name__))

        def leave(_module: nn.Module, _args: object, _output: object) -> None:
            if self._stack:
                self._stack.pop()

        pre = nn.modules.module.register_module_forward_pre_hook(enter)
        post = nn.modules.module.register_module_forward_hook(leave, always_call=True)
        try:
            yield self
        finally:
            pre.remove()
            post.remove()
            self._stack.clear()

    def owner_of(self, root: nn.Module) -> dict[int, str]:
        """`id(parameter or buffer)` → the folded path of the module that owns it."""
        owners = {}
        for name, module in root.named_modules():
            where = fold_indices(name) if name else type(root).__name__
            for tensor in (*module.parameters(recurse=False), *module.buffers(recurse=False)):
                owners.setdefault(id(tensor), where)
        return owners


def group_holders(
    live: dict[int, int],
    origin: dict[int, tuple[str, tuple[int, ...], torch.dtype]],
    kind_of: dict[int, str],
    *,
    top: int = 8,
) -> tuple[Holder, ...]:
    """The `top` largest (where, kind) groups of the storages in `live` (serial → bytes)."""
    groups: dict[tuple[str, str], list[int]] = {}
    for serial in live:
        where = origin.get(serial, (OUTSIDE, (), torch.float32))[0]
        groups.setdefault((where, kind_of.get(serial, TEMPORARY)), []).append(serial)
    holders = []
    for (where, kind), serials in groups.items():
        largest = max(serials, key=live.__getitem__)
        _, shape, dtype = origin.get(largest, (OUTSIDE, (), torch.float32))
        holders.append(
            Holder(
                where=where,
                kind=kind,
                bytes=sum(live[serial] for serial in serials),
                tensors=len(serials),
                largest_shape=tuple(shape),
                dtype=str(dtype).removeprefix("torch."),
            )
        )
    holders.sort(key=lambda holder: holder.bytes, reverse=True)
    return tuple(holders[:top])
