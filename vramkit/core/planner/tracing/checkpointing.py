"""Gradient checkpointing for any model: recompute each repeated block in the backward pass."""

from __future__ import annotations

import functools
from typing import Any

from torch import nn
from torch.utils.checkpoint import checkpoint

_NON_REENTRANT = {"use_reentrant": False}


def _has_submodules_with_parameters(module: nn.Module) -> bool:
    return any(any(True for _ in child.parameters()) for child in module.children())


def _blocks(root: nn.Module) -> list[nn.Module]:
    """The children of Sequential/ModuleList containers that are themselves composite layers.

    Those are the repeated blocks (ResNet stages' BasicBlocks, transformer layers). Blocks
    nested inside a block already chosen are left to it.
    """
    chosen: list[nn.Module] = []
    inside: set[int] = set()
    for module in root.modules():
        if id(module) in inside:
            continue
        if not isinstance(module, (nn.Sequential, nn.ModuleList)):
            continue
        for child in module.children():
            if _has_submodules_with_parameters(child):
                chosen.append(child)
                inside.update(id(m) for m in child.modules())
    return chosen


def _checkpointed(forward: Any) -> Any:
    @functools.wraps(forward)
    def run(*args: Any, **kwargs: Any) -> Any:
        return checkpoint(forward, *args, use_reentrant=False, **kwargs)

    return run


def enable_gradient_checkpointing(module: nn.Module) -> int:
    """Turn on activation checkpointing in `module`; return how many blocks it covers (0: none).

    Hugging Face models use their own switch (`activation_checkpointing_enable`, before
    transformers 5 `gradient_checkpointing_enable`) on the outermost model; any other model gets
    each repeated block's forward wrapped in `torch.utils.checkpoint` (non-reentrant), so only
    block inputs are kept and the rest is recomputed during the backward pass.
    """
    count = 0
    covered: set[int] = set()
    for sub in module.modules():
        if id(sub) in covered or not getattr(sub, "supports_gradient_checkpointing", False):
            continue
        if hasattr(sub, "activation_checkpointing_enable"):  # transformers 5
            sub.activation_checkpointing_enable(activation_checkpointing_kwargs=_NON_REENTRANT)
        elif hasattr(sub, "gradient_checkpointing_enable"):
            sub.gradient_checkpointing_enable(gradient_checkpointing_kwargs=_NON_REENTRANT)
        else:
            continue
        covered.update(id(m) for m in sub.modules())
        count += sum(1 for m in sub.modules() if getattr(m, "gradient_checkpointing", False))
    if count:
        return count
    blocks = _blocks(module)
    for block in blocks:
        block.forward = _checkpointed(block.forward)
    return len(blocks)
