"""Apply command-line overrides to a composed config, as if they had been typed after the rest.

The automatic fit (`hw.fit: auto`) changes a run with overrides it prints; the run must then be
exactly `python train.py <original overrides> <printed overrides>`. Hydra applies a `key=value`
override to the composed config with `OmegaConf.update` after every config group is merged
(`ConfigLoaderImpl._apply_overrides_to_config`, hydra/_internal/config_loader_impl.py); here the
same function applies it, so the two agree by construction. An override that picks a config
group option (`trainer=deepspeed_zero2_offload`) changes the defaults list: the config is then
composed again with all overrides, in the Hydra run that is going on.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from hydra import compose
from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig, open_dict

from vramkit.core.config.source import command_line_overrides


class OverrideError(RuntimeError):
    """The overrides cannot be applied to this config (a group choice outside a Hydra run)."""


def is_group_choice(key: str, conf_dir: Path) -> bool:
    """Whether `key` (an override's key) names a config group of `conf_dir` ("trainer")."""
    return "." not in key and (Path(conf_dir) / key).is_dir()


def append_overrides(cfg: DictConfig, overrides: Sequence[str], *, conf_dir: Path) -> None:
    """Change `cfg` in place as `overrides`, typed after the command's own, would have."""
    parsed = OverridesParser.create().parse_overrides(list(overrides))
    if any(is_group_choice(o.key_or_group, conf_dir) for o in parsed):
        _recompose(cfg, overrides)
        return
    with open_dict(cfg):
        ConfigLoaderImpl._apply_overrides_to_config(parsed, cfg)


def _recompose(cfg: DictConfig, overrides: Sequence[str]) -> None:
    if not (GlobalHydra.instance().is_initialized() and HydraConfig.initialized()):
        raise OverrideError(
            f"{' '.join(overrides)} picks a config group option, which needs the config composed "
            "again; this process has no Hydra run to do it: append the overrides to the command"
        )
    config_name = HydraConfig.get().job.config_name
    fresh = compose(config_name, overrides=[*command_line_overrides(), *overrides])
    with open_dict(cfg):
        for key in [key for key in cfg if key not in fresh]:
            del cfg[key]
        for key in fresh:
            cfg[key] = fresh._get_node(key)  # the node, not its value: interpolations stay
