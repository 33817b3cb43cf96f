"""A metric to monitor that the task never logs is refused before any work.

Lightning finds out only at the end of the first validation (``ModelCheckpoint`` raises
"could not find the monitored key"), after a whole epoch; a sweep's ``optimized_metric`` typo is
never found at all (it returns None). Here every monitored name (``optimized_metric`` and each
callback's ``monitor``) is compared with the names the model's LightningModule says it logs
(`DeclaresLoggedMetrics`, part of the workload contract in ``vramkit/core/workload.py``; a test
checks each task's declaration against what a real run logs).
A module that does not say is not checked; names outside ``train/``, ``val/`` and ``test/``
(callbacks' own, such as ``perf/…``) are not checked either.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any, Protocol, runtime_checkable

from hydra.utils import get_class
from omegaconf import DictConfig

from vramkit.core.config.schema import ConfigError
from vramkit.core.config.source import closest, source_of

_CHECKED_PHASES = ("train/", "val/", "test/")


@runtime_checkable
class DeclaresLoggedMetrics(Protocol):
    """A LightningModule class that states the metric names a run of it logs."""

    @classmethod
    def logged_metrics(cls, model_cfg: Any = None) -> Collection[str]:
        """Every name ``self.log`` gets in a run built from the model node `model_cfg`
        (``train/loss``, ``val/hmean``, ...), whatever the data."""


def check_monitored_metrics(cfg: DictConfig) -> None:
    """Refuse a monitored metric name the model never logs, with the closest one it does."""
    logged = declared_metrics(cfg.get("model"))
    if logged is None:
        return
    problems = []
    for key, name, file in _monitors(cfg):
        if not name.startswith(_CHECKED_PHASES) or name in logged:
            continue
        near = closest(name, sorted(logged))
        hint = f"; did you mean {near!r}?" if near else ""
        problems.append(
            f"{key}={name!r} ({file}) is a metric the model never logs{hint} It logs: "
            + ", ".join(sorted(logged))
        )
        break  # one typo in optimized_metric repeats in every monitor that reads it
    if problems:
        raise ConfigError("\n".join(problems), ())


def declared_metrics(model_cfg: DictConfig | None) -> Collection[str] | None:
    """The metric names the model config's LightningModule declares, or None if it does not."""
    target = model_cfg.get("_target_") if isinstance(model_cfg, DictConfig) else None
    if not isinstance(target, str):
        return None
    try:
        module_class = get_class(target)
    except (ImportError, ValueError):
        return None  # instantiation names the bad target with Hydra's own message
    if not isinstance(module_class, DeclaresLoggedMetrics):
        return None
    return frozenset(module_class.logged_metrics(model_cfg))


def _monitors(cfg: DictConfig) -> list[tuple[str, str, str]]:
    found = []
    optimized = cfg.get("optimized_metric")
    if isinstance(optimized, str):
        found.append(("optimized_metric", optimized, source_of("task").file))
    callbacks = cfg.get("callbacks")
    if isinstance(callbacks, DictConfig):
        for name, callback in callbacks.items():
            monitor = callback.get("monitor") if isinstance(callback, DictConfig) else None
            if isinstance(monitor, str):
                found.append((f"callbacks.{name}.monitor", monitor, f"conf/callbacks/{name}.yaml"))
    return found
