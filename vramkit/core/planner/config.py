"""The config and profile to plan: composed as `python train.py` composes them."""

from __future__ import annotations

from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, open_dict

from vramkit.core.hardware.detect import detect_profile, display_path, probe_device
from vramkit.core.hardware.profile import HardwareProfile, ProfileSource, validate_profile


def compose_train_config(overrides: list[str], conf_dir: Path) -> DictConfig:
    """`conf_dir/train.yaml` with `overrides`, composed as `python train.py` composes it.

    Hydra's run settings are registered (`+hw=` choices, overrides) and then dropped from the
    config, as under `@hydra.main`.
    """
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(conf_dir), version_base="1.3"):
        cfg = compose("train", overrides=overrides, return_hydra_config=True)
    HydraConfig.instance().set_config(cfg)
    with open_dict(cfg):
        del cfg.hydra
    return cfg


def target_profile(cfg: DictConfig, conf_dir: Path) -> HardwareProfile:
    """The profile to plan for, written into `cfg.hw`.

    `+hw=<name>` is taken as given and never checked against this machine (a T4 plan is made
    on any computer). Without a profile name, the one this machine would be detected as, with
    any `hw.*` keys given on top.
    """
    given = cfg.get("hw")
    if given is None or "name" not in given:
        detection = detect_profile(probe_device(), conf_dir / "hw", display_root=conf_dir.parent)
        raw = detection.raw
        if given is not None:
            raw.merge_with(given)
        with open_dict(cfg):
            cfg.hw = raw
        return validate_profile(cfg.hw, detection.source)
    choice = HydraConfig.get().runtime.choices.get("hw") if HydraConfig.initialized() else None
    path = conf_dir / "hw" / f"{choice or given.name}.yaml"
    file = display_path(path, conf_dir.parent) if path.is_file() else "the hw config"
    return validate_profile(cfg.hw, ProfileSource(file))
