"""Hold back ``self.log`` calls of micro-batches and log them once, as the whole batch would."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import lightning as L
import torch

_LOG_SIGNATURE = inspect.signature(L.LightningModule.log)
_MEAN = {"mean", "avg", torch.mean}
_SUM = {"sum", torch.sum}
_MAX = {"max", torch.max}
_MIN = {"min", torch.min}


@dataclass
class _Call:
    name: str
    value: Any
    args: tuple[Any, ...]  # LightningModule.log's further arguments, as the call gave them
    kwargs: dict[str, Any]
    samples: int  # samples of the micro-batch that made the call

    def options(self) -> dict[str, Any]:
        """Every argument of ``LightningModule.log`` but the name and the value, by keyword."""
        bound = _LOG_SIGNATURE.bind(None, self.name, self.value, *self.args, **self.kwargs)
        return {k: v for k, v in bound.arguments.items() if k not in ("self", "name", "value")}


class LogBuffer:
    """Records the ``self.log`` calls of a module's micro-batches and replays them merged.

    A guarded module routes its ``log`` calls to :meth:`record` while a micro-batch runs. A
    micro-batch's calls are kept only when it completes (:meth:`commit`); an attempt that
    ran out of memory is dropped (:meth:`drop`), so a redone micro-batch is never counted
    twice. :meth:`replay` logs each name once with the value the whole batch would have
    logged: the sample-weighted mean for ``reduce_fx="mean"`` (weights are the calls'
    ``batch_size``, else the micro-batch sizes), the sum, max or min for those reductions.
    Values of other kinds (torchmetrics objects) or other reductions are replayed call by call,
    and so is a name logged once, with the arguments it was given. A step that ran as one
    micro-batch (the usual step) replays its calls as they were made, nothing bound or merged:
    what Lightning would have received without the guard.
    """

    def __init__(self) -> None:
        # Calls as plain tuples, the fields of _Call: recorded on every step, merged rarely.
        self._committed: list[tuple[Any, ...]] = []
        self._pending: list[tuple[Any, ...]] = []
        self._samples = 0
        self._completed = 0  # micro-batches committed since the last replay

    def start(self, samples: int) -> None:
        """A micro-batch of ``samples`` samples starts: its calls are recorded from now on."""
        self._samples = samples

    def record(self, name: str, value: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Hold back one ``log(name, value, *args, **kwargs)`` call of the running micro-batch."""
        self._pending.append((name, value, args, kwargs, self._samples))

    def commit(self) -> None:
        """Keep the calls of the micro-batch that just completed."""
        self._committed.extend(self._pending)
        self._pending = []
        self._completed += 1

    def drop(self) -> None:
        """Forget the calls of a micro-batch that did not complete."""
        self._pending = []

    def replay(self, log: Callable[..., None]) -> None:
        """Send the committed calls to ``log`` (the module's real ``log``), merged by name."""
        committed, completed = self._committed, self._completed
        self._committed, self._completed = [], 0
        if completed == 1:
            for name, value, args, kwargs, _ in committed:
                log(name, value, *args, **kwargs)
            return
        groups: dict[str, list[_Call]] = {}
        for fields in committed:
            call = _Call(*fields)
            groups.setdefault(call.name, []).append(call)
        for name, calls in groups.items():
            merged = _merge(calls) if len(calls) > 1 else None
            if merged is None:
                for call in calls:
                    log(call.name, call.value, *call.args, **call.kwargs)
                continue
            value, options = merged
            log(name, value, **options)


class HeldCalls(list[tuple[str, Any, tuple[Any, ...], dict[str, Any]]]):
    """The ``self.log`` calls of a training step that runs whole, as one batch: logged as they
    were made once it completes (:meth:`replay`), forgotten if it ran out of memory. What
    :class:`LogBuffer` does for one micro-batch, without its bookkeeping for merging several
    (about 60 bytecodes per step, opcode tracing of ``benchmarks/step_overhead.py``)."""

    def record(self, name: str, value: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Hold back one ``log(name, value, *args, **kwargs)`` call."""
        self.append((name, value, args, kwargs))

    def replay(self, log: Callable[..., None]) -> None:
        """Send the held calls to ``log`` (the module's real ``log``), in their order."""
        for name, value, args, kwargs in self:
            log(name, value, *args, **kwargs)


def _merge(calls: list[_Call]) -> tuple[Any, dict[str, Any]] | None:
    if not all(isinstance(call.value, (torch.Tensor, int, float)) for call in calls):
        return None
    options = [call.options() for call in calls]
    reduce_fx = options[0].get("reduce_fx", "mean")
    if isinstance(reduce_fx, str):
        reduce_fx = reduce_fx.lower()
    values = [call.value for call in calls]
    weights = [o.get("batch_size") or call.samples for o, call in zip(options, calls, strict=True)]
    if reduce_fx in _MEAN:
        value = sum(v * w for v, w in zip(values, weights, strict=True)) / sum(weights)
    elif reduce_fx in _SUM:
        value = sum(values)
    elif reduce_fx in _MAX:
        value = _extreme(values, torch.maximum, max)
    elif reduce_fx in _MIN:
        value = _extreme(values, torch.minimum, min)
    else:
        return None
    merged = dict(options[0])
    if "batch_size" in merged:
        merged["batch_size"] = sum(weights)
    return value, merged


def _extreme(values: list[Any], tensor_op: Callable, number_op: Callable) -> Any:
    if any(isinstance(v, torch.Tensor) for v in values):
        result = torch.as_tensor(values[0])
        for v in values[1:]:
            result = tensor_op(result, torch.as_tensor(v, device=result.device))
        return result
    return number_op(values)
