"""Several callbacks that Lightning visits as one."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import lightning as L

from vramkit.core.trainer_assembly.batch_hooks import (
    PER_BATCH_HOOKS,
    REFRESH,
    implements,
    taken_over_hooks,
)

# Every hook of Lightning's Callback but the per-batch ones and the two state methods.
PHASE_HOOKS = tuple(
    name
    for name, member in vars(L.Callback).items()
    if inspect.isfunction(member)
    and (name.startswith("on_") or name in ("setup", "teardown"))
    and name not in PER_BATCH_HOOKS
)


class CallbackGroup(L.Callback):
    """Callbacks registered with Lightning as one callback.

    Lightning visits every registered callback at each of a training step's six hooks, even
    one whose hook is switched off (``_call_callback_hooks`` in
    lightning/pytorch/trainer/call.py: a ``getattr`` and a ``callable`` test per callback and
    hook), and wraps each call of a hook in a profiler context. Traced opcode by opcode on
    ``benchmarks/step_overhead.py``'s tiny model, that was the largest part of vramkit's cost
    per step: about 55 bytecodes per registered callback and step, about 110 more per hook
    that does run. The group is one registered callback: each hook reaches the members that
    implement it, in their order.

    Which per-batch hooks are live is decided when the group is built and again whenever a
    member switches one (``switch_batch_hook`` in batch_hooks.py, the one way to switch a
    member's hook off or on for the rest of the run), not at every batch: a hook no member runs
    is None on the group (Lightning passes it over), a hook one member runs is that member's
    bound hook itself (Lightning calls it with no forwarding frame), and a hook several run
    calls them in turn.

    Callbacks that Lightning finds by type (the progress bar, a checkpoint) stay registered on
    their own, but the group can run their per-batch hooks too (``leading`` before the
    members', ``trailing`` after): each such hook is then None on the callback itself, so
    Lightning passes it over, and one group hook call per batch does the work of several.
    Their other hooks Lightning calls as before.

    A checkpoint holds the members' states under the group's key, each under its own key; a
    checkpoint written before the group (each member's state at the top level) still restores
    them. With a profiler (``trainer.profiler=simple``) the members' hooks show as the group's.

    Args:
        members: the callbacks, in the order their hooks run.
        leading: registered callbacks whose per-batch hooks run before the members'.
        trailing: registered callbacks whose per-batch hooks run after the members'.
    """

    # Callback.state_key's value, as a plain attribute: Lightning reads it at every hook call
    # (its profiler's action name), and the property is a Python call each time.
    state_key = "CallbackGroup"

    def __init__(
        self,
        members: Sequence[L.Callback],
        leading: Sequence[L.Callback] = (),
        trailing: Sequence[L.Callback] = (),
    ) -> None:
        self.members = list(members)
        self._phase: dict[str, list[Callable[..., Any]]] = {
            hook: [getattr(member, hook) for member in self.members if implements(member, hook)]
            for hook in PHASE_HOOKS
        }
        # Each entry has the hook as an attribute, None while it is switched off: a member
        # itself, or the hooks taken over from a registered callback.
        self._batch: dict[str, list[Any]] = {
            hook: [
                *_take_over(leading, hook),
                *(member for member in self.members if implements(member, hook)),
                *_take_over(trailing, hook),
            ]
            for hook in PER_BATCH_HOOKS
        }
        for callback in (*leading, *self.members, *trailing):
            callback.__dict__[REFRESH] = self.refresh_batch_hooks
        self.refresh_batch_hooks()

    def refresh_batch_hooks(self) -> None:
        """Decide, for each per-batch hook, what Lightning calls: None (no live entry), the one
        live entry's bound hook, or a call of each live one in order."""
        for hook, entries in self._batch.items():
            live = tuple(call for call in (getattr(e, hook) for e in entries) if call is not None)
            if not live:
                setattr(self, hook, None)
            elif len(live) == 1:
                setattr(self, hook, live[0])
            else:
                setattr(self, hook, partial(_call_each, live))

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
        for member_hook in self._phase["on_load_checkpoint"]:
            member_hook(trainer, pl_module, checkpoint)
        # A checkpoint written before the group holds each member's state at the top level;
        # Lightning loads states right after every on_load_checkpoint
        # (CheckpointConnector.restore_callbacks), so these load at the same point.
        states = checkpoint.get("callbacks") or {}
        if self.state_key not in states:
            self.load_state_dict(states)


def _take_over(callbacks: Sequence[L.Callback], hook: str) -> list[Any]:
    """``hook`` of each of ``callbacks`` that has one to run, switched off on the callback (None:
    Lightning passes it over) and kept, bound, for the group to call: the entries hold it
    (``switch_batch_hook`` in batch_hooks.py switches it there)."""
    entries = []
    for callback in callbacks:
        bound = getattr(callback, hook)
        if bound is not None and implements(callback, hook):
            setattr(callback, hook, None)
            taken = taken_over_hooks(callback)
            setattr(taken, hook, bound)
            entries.append(taken)
    return entries


def _phase_forwarding(hook: str) -> Callable[..., None]:
    def method(self: CallbackGroup, *args: Any, **kwargs: Any) -> None:
        for member_hook in self._phase[hook]:
            member_hook(*args, **kwargs)

    return _named(method, hook)


def _call_each(calls: tuple[Callable[..., None], ...], *args: Any, **kwargs: Any) -> None:
    for call in calls:
        call(*args, **kwargs)


def _named(method: Callable[..., None], hook: str) -> Callable[..., None]:
    method.__name__ = method.__qualname__ = hook
    method.__doc__ = f"Calls ``{hook}`` of the members that implement it."
    return method


for _hook in PHASE_HOOKS:
    if _hook not in vars(CallbackGroup):
        setattr(CallbackGroup, _hook, _phase_forwarding(_hook))
