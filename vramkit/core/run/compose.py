"""The one way to compose the project's config outside ``@hydra.main``: scripts, benchmarks, tests.

``compose_config("train", overrides)`` gives what ``python train.py <overrides>`` gets: the same
defaults list, the same resolvers, and Hydra's run context (``+hw=`` choice, the command-line
overrides) registered, so error messages can name the file and override a value came from.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, open_dict

from vramkit.core.run.resolvers import CONF_DIR, REPO_ROOT, register_resolvers

__all__ = ["CONF_DIR", "REPO_ROOT", "compose_config", "forget_composition"]


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
    Hydra's run folder (``paths.output_dir``; required when the config is resolved, since no
    Hydra run creates one here); the caller moves other paths with overrides
    (``paths.data_dir=...``).
    """
    register_resolvers()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(Path(conf_dir)), version_base="1.3"):
        cfg = compose(config_name, overrides=list(overrides), return_hydra_config=True)
    HydraConfig.instance().set_config(cfg)
    with open_dict(cfg):
        if output_dir is not None and "paths" in cfg:
            cfg.paths.output_dir = str(output_dir)
        del cfg.hydra
    return cfg


def forget_composition() -> None:
    """Clear Hydra's global state, so a later composition or ``@hydra.main`` starts afresh."""
    GlobalHydra.instance().clear()
    HydraConfig.instance().cfg = None
