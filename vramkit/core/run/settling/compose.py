"""The one way to compose the project's config: scripts, benchmarks, tests, and the run itself.

``compose_config("train", overrides)`` gives what ``python train.py <overrides>`` gets: the same
defaults list, the same resolvers, and Hydra's run context (``+hw=`` choice, the command-line
overrides) registered, so error messages can name the file and override a value came from.
``compose_run`` composes a run's config again, with the settlement's overrides appended
(:mod:`vramkit.core.run.settling.settle`), through Hydra's public compose API.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf, open_dict

from vramkit.core.run.settling.resolvers import CONF_DIR, REPO_ROOT, register_resolvers

__all__ = [
    "CONF_DIR",
    "REPO_ROOT",
    "compose_config",
    "compose_run",
    "edited_since_composed",
    "forget_composition",
]

_composed: dict[int, tuple[weakref.ref, dict]] = {}
"""What `compose_config` returned, by object id: the config (weakly) and its unresolved values
then, so a run can tell an edit made in code (which would not reach it) from the composition."""


def compose_config(
    config_name: str = "train",
    overrides: Sequence[str] = (),
    *,
    conf_dir: Path = CONF_DIR,
    output_dir: Path | None = None,
) -> DictConfig:
    """``conf_dir/<config_name>.yaml`` with ``overrides``, composed as ``@hydra.main`` does.

    Hydra's run settings are registered (so ``+hw=`` choices and overrides are known) and then
    dropped from the returned config, as under ``@hydra.main``. ``output_dir`` takes the place of
    Hydra's run folder (the override ``paths.output_dir=<output_dir>`` before the others, so a
    run's config composed again keeps it; required when the config is resolved, since no Hydra run
    creates one here); the caller moves other paths with overrides (``paths.data_dir=...``).
    """
    register_resolvers()
    if output_dir is not None:  # first: an override of the caller's own moves it again
        overrides = [f"paths.output_dir={output_dir}", *overrides]
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(Path(conf_dir)), version_base="1.3"):
        cfg = compose(config_name, overrides=overrides, return_hydra_config=True)
    HydraConfig.instance().set_config(cfg)
    with open_dict(cfg):
        del cfg.hydra
    key = id(cfg)

    def forget(dead: weakref.ref) -> None:  # a later config may have taken the same id
        if _composed.get(key, (None,))[0] is dead:
            del _composed[key]

    _composed[key] = (weakref.ref(cfg, forget), _flat(cfg))
    return cfg


def edited_since_composed(cfg: DictConfig) -> list[str]:
    """The keys of `cfg` changed, added or removed in code since `compose_config` returned it
    (sorted; empty for a config composed elsewhere, e.g. by ``@hydra.main``)."""
    ref, values = _composed.get(id(cfg), (None, None))
    if ref is None or ref() is not cfg:
        return []
    now = _flat(cfg)
    return sorted(key for key in values.keys() | now.keys() if values.get(key) != now.get(key))


def _flat(cfg: DictConfig) -> dict:
    """`cfg`'s leaves, unresolved, as ``{"a.b": value}``."""
    flat: dict = {}

    def walk(node: object, prefix: str) -> None:
        if isinstance(node, dict) and node:
            for key, value in node.items():
                walk(value, f"{prefix}{key}.")
        elif isinstance(node, list) and node:
            for index, value in enumerate(node):
                walk(value, f"{prefix}{index}.")
        else:
            flat[prefix[:-1]] = node

    walk(OmegaConf.to_container(cfg, resolve=False), "")
    return flat


def compose_run(config_name: str, overrides: Sequence[str], *, conf_dir: Path) -> DictConfig:
    """``<config_name>.yaml`` with ``overrides``, through Hydra's public compose API.

    Inside a Hydra app (``@hydra.main``, whose GlobalHydra stays initialised while the task runs)
    the app's config search path composes it; elsewhere ``conf_dir`` is initialised for this one
    composition. Hydra's run context is left as it is: messages keep naming the user's overrides.
    """
    register_resolvers()
    if GlobalHydra.instance().is_initialized():
        return compose(config_name, overrides=list(overrides))
    with initialize_config_dir(config_dir=str(Path(conf_dir)), version_base="1.3"):
        return compose(config_name, overrides=list(overrides))


class SettledRun(Protocol):
    """What composing a settled run needs (`vramkit.core.run.settling.settle.Settlement`)."""

    config_name: str
    conf_dir: str

    @property
    def run_overrides(self) -> tuple[str, ...]: ...


def settled_config(settlement: SettledRun) -> DictConfig:
    """The run's config: `settlement.run_overrides` composed through Hydra's public API (the
    second and last composition of a run: the first is the user's overrides alone)."""
    return compose_run(
        settlement.config_name, settlement.run_overrides, conf_dir=Path(settlement.conf_dir)
    )


def forget_composition() -> None:
    """Clear Hydra's global state, so a later composition or ``@hydra.main`` starts afresh."""
    GlobalHydra.instance().clear()
    HydraConfig.instance().cfg = None
