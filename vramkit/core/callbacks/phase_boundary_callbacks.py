"""Callbacks that act only at phase boundaries, registered with Lightning as one."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

import lightning as L

from vramkit.core.callbacks.batch_hooks import PER_BATCH_HOOKS, implemented_batch_hooks, implements

# Every hook of Lightning's Callback but the per-batch ones and the two state methods.
FORWARDED_HOOKS = tuple(
    name
    for name, member in vars(L.Callback).items()
    if inspect.isfunction(member)
    and (name.startswith("on_") or name in ("setup", "teardown"))
    and name not in PER_BATCH_HOOKS
)


class PhaseBoundaryCallbacks(L.Callback):
    """Several callbacks without a per-batch hook, which Lightning visits as one.

    Lightning visits every registered callback at each of a training step's six hooks, even
    one whose hook is switched off (``_call_callback_hooks`` in
    lightning/pytorch/trainer/call.py: a ``getattr`` and a ``callable`` test per callback and
    hook). Traced opcode by opcode on ``benchmarks/step_overhead.py``'s tiny model, that loop
    was the largest part of vramkit's cost per step: about 75 bytecodes per callback per step,
    1,050 for the defaults' 14 callbacks, against about 600 for the whole OOM guard. The members
    here act only when a fit, an epoch, a validation or a test starts or ends, or when a
    checkpoint is written or read, so Lightning passes over one callback per step instead of
    several; every other hook reaches the members that implement it, in their order.

    A checkpoint holds the members' states under the group's key, each under its own key; a
    checkpoint written before the group (each member's state at the top level) still restores
    them.

    Args:
        members: callbacks that implement none of the per-batch hooks.
    """

    def __init__(self, members: Sequence[L.Callback]) -> None:
        busy = [type(member).__name__ for member in members if implemented_batch_hooks(member)]
        if busy:
            raise ValueError(f"PhaseBoundaryCallbacks: {busy} implement per-batch hooks")
        self.members = list(members)
        self._hooks: dict[str, list[Callable[..., Any]]] = {
            hook: [getattr(member, hook) for member in self.members if implements(member, hook)]
            for hook in FORWARDED_HOOKS
        }
        for hook in PER_BATCH_HOOKS:
            setattr(self, hook, None)  # not callable: Lightning skips it (see working_set.py)

    def _forward(self, hook: str, *args: Any, **kwargs: Any) -> None:
        for method in self._hooks[hook]:
            method(*args, **kwargs)

    def state_dict(self) -> dict[str, Any]:
        """The members' states by their own state keys (those with a state)."""
        states = {member.state_key: member.state_dict() for member in self.members}
        return {key: state for key, state in states.items() if state}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        for member in self.members:
            if member.state_key in state_dict:
                member.load_state_dict(state_dict[member.state_key])

    def on_load_checkpoint(
        self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        self._forward("on_load_checkpoint", trainer, pl_module, checkpoint)
        # A checkpoint written before the group holds each member's state at the top level;
        # Lightning loads states right after every on_load_checkpoint
        # (CheckpointConnector.restore_callbacks), so these load at the same point.
        states = checkpoint.get("callbacks") or {}
        if self.state_key not in states:
            self.load_state_dict(states)


def _forwarding(hook: str) -> Callable[..., None]:
    def forward(self: PhaseBoundaryCallbacks, *args: Any, **kwargs: Any) -> None:
        self._forward(hook, *args, **kwargs)

    forward.__name__ = forward.__qualname__ = hook
    forward.__doc__ = f"Calls ``{hook}`` of the members that implement it."
    return forward


for _hook in FORWARDED_HOOKS:
    if _hook not in vars(PhaseBoundaryCallbacks):
        setattr(PhaseBoundaryCallbacks, _hook, _forwarding(_hook))
