"""A model's body of N identical blocks, and the same model cut to its first few of them.

A transformer spends most of a traced step's ops in its decoder blocks (Hugging Face
`model.layers`, `transformer.h`, `gpt_neox.layers`, ...). `repeated_blocks` finds such a list by
structure, not by family name: an `nn.ModuleList` whose children have one class, the same
parameter and buffer shapes, dtypes and trainability, and the same plain attributes (a counter
equal to the block's index, transformers' `layer_idx`, aside). `cut_to` keeps only the first
few while a shorter step is traced (`block_extrapolation`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch import nn

MIN_BLOCKS = 4
"""A list with fewer blocks is not worth extrapolating (nor told from a coincidence)."""
_PLAIN = (bool, int, float, str, type(None))


def _attributes(module: nn.Module) -> dict[str, Any]:
    """The plain attributes `module` keeps (its configuration) and how many hooks it has."""
    values: dict[str, Any] = {}
    for name, value in vars(module).items():
        if name.endswith("hooks"):
            values[name] = len(value)
        elif name.startswith("_"):
            continue
        elif isinstance(value, _PLAIN) or (
            isinstance(value, tuple) and all(isinstance(v, _PLAIN) for v in value)
        ):
            values[name] = value
        elif not isinstance(value, (torch.Tensor, nn.Module)):
            values[name] = type(value).__qualname__
    return values


def block_signature(block: nn.Module) -> dict[tuple[str, str], Any]:
    """Per submodule of `block`: its class, parameters and buffers (shape, dtype, whether
    trained) and plain attributes."""
    signature: dict[tuple[str, str], Any] = {}
    for name, module in block.named_modules():
        signature[name, "<class>"] = type(module).__qualname__
        for key, p in module._parameters.items():
            if p is not None:
                signature[name, f"<parameter {key}>"] = (tuple(p.shape), p.dtype, p.requires_grad)
        for key, b in module._buffers.items():
            if b is not None:
                signature[name, f"<buffer {key}>"] = (tuple(b.shape), b.dtype)
        for key, value in _attributes(module).items():
            signature[name, key] = value
    return signature


def identical_blocks(blocks: Sequence[nn.Module]) -> bool:
    """Whether all `blocks` have one signature, an attribute counting them (0, 1, 2, ...:
    Hugging Face's `layer_idx`) aside."""
    signatures = [block_signature(block) for block in blocks]
    if any(s.keys() != signatures[0].keys() for s in signatures[1:]):
        return False
    for key in signatures[0]:
        values = [s[key] for s in signatures]
        if values != list(range(len(blocks))) and any(v != values[0] for v in values[1:]):
            return False
    return True


def repeated_blocks(model: nn.Module) -> nn.ModuleList | None:
    """The `nn.ModuleList` of at least `MIN_BLOCKS` identical blocks with the most parameters,
    or None. Parameters shared between blocks (or with the rest of the model) disqualify a
    list: cutting it would change what the rest holds."""
    found = []
    for _, module in model.named_modules():
        if type(module) is not nn.ModuleList or len(module) < MIN_BLOCKS:
            continue
        if _shares_parameters(model, module) or not identical_blocks(module):
            continue
        found.append((sum(p.numel() for p in module.parameters()), len(found), module))
    return max(found)[2] if found else None


def _shares_parameters(model: nn.Module, blocks: nn.ModuleList) -> bool:
    inside = [id(p) for block in blocks for p in block.parameters()]
    if len(set(inside)) != len(inside):
        return True
    ids = set(inside)
    listed = {id(module) for module in blocks.modules()}
    for module in model.modules():
        if id(module) in listed:
            continue
        if any(id(p) in ids for p in module.parameters(recurse=False)):
            return True
    return False


def keep_first(blocks: nn.ModuleList, count: int) -> dict[str, nn.Module]:
    """Make `blocks` hold only its first `count` blocks (the same objects); the blocks it held."""
    kept = blocks._modules
    blocks._modules = dict(list(kept.items())[:count])
    return kept


@contextlib.contextmanager
def cut_to(blocks: nn.ModuleList, count: int) -> Iterator[None]:
    """While inside, `blocks` holds only its first `count` blocks (the same objects)."""
    kept = keep_first(blocks, count)
    try:
        yield
    finally:
        blocks._modules = kept
