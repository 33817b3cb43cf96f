"""Hold back ``self.log`` calls of micro-batches and log them once, as the whole batch would."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from contextlib import contextmanager
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
    options: dict[str, Any]  # every other argument of LightningModule.log, by keyword
    samples: int  # samples of the micro-batch that made the call


class LogBuffer:
    """Records the ``self.log`` calls of a module's micro-batches and replays them merged.

    A micro-batch's calls are kept only when it completes (:meth:`commit`); an attempt that
    ran out of memory is dropped (:meth:`drop`), so a redone micro-batch is never counted
    twice. :meth:`replay` logs each name once with the value the whole batch would have
    logged: the sample-weighted mean for ``reduce_fx="mean"`` (weights are the calls'
    ``batch_size``, else the micro-batch sizes), the sum, max or min for those reductions.
    Values of other kinds (torchmetrics objects) or other reductions are replayed call by call.
    """

    def __init__(self) -> None:
        self._committed: list[_Call] = []
        self._pending: list[_Call] = []

    @contextmanager
    def capture(self, module: L.LightningModule, samples: int) -> Iterator[None]:
        """While active, ``module.log`` (and ``log_dict``) calls are recorded, not logged."""

        def record(*args: Any, **kwargs: Any) -> None:
            bound = _LOG_SIGNATURE.bind(module, *args, **kwargs)
            arguments = dict(bound.arguments)
            del arguments["self"]
            name, value = arguments.pop("name"), arguments.pop("value")
            self._pending.append(_Call(name, value, arguments, samples))

        # An instance attribute shadows the method for this module only.
        module.log = record
        try:
            yield
        finally:
            del module.log

    def commit(self) -> None:
        """Keep the calls of the micro-batch that just completed."""
        self._committed.extend(self._pending)
        self._pending = []

    def drop(self) -> None:
        """Forget the calls of a micro-batch that did not complete."""
        self._pending = []

    def replay(self, log: Callable[..., None]) -> None:
        """Send the committed calls to ``log`` (the module's real ``log``), merged by name."""
        groups: dict[str, list[_Call]] = {}
        for call in self._committed:
            groups.setdefault(call.name, []).append(call)
        self._committed = []
        for name, calls in groups.items():
            merged = _merge(calls) if len(calls) > 1 else None
            if merged is None:
                for call in calls:
                    log(call.name, call.value, **call.options)
                continue
            value, options = merged
            log(name, value, **options)


def _merge(calls: list[_Call]) -> tuple[Any, dict[str, Any]] | None:
    if not all(isinstance(call.value, (torch.Tensor, int, float)) for call in calls):
        return None
    reduce_fx = calls[0].options.get("reduce_fx", "mean")
    if isinstance(reduce_fx, str):
        reduce_fx = reduce_fx.lower()
    values = [call.value for call in calls]
    weights = [call.options.get("batch_size") or call.samples for call in calls]
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
    options = dict(calls[0].options)
    if "batch_size" in options:
        options["batch_size"] = sum(weights)
    return value, options


def _extreme(values: list[Any], tensor_op: Callable, number_op: Callable) -> Any:
    if any(isinstance(v, torch.Tensor) for v in values):
        result = torch.as_tensor(values[0])
        for v in values[1:]:
            result = tensor_op(result, torch.as_tensor(v, device=result.device))
        return result
    return number_op(values)
