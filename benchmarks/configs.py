"""Compose the project's Hydra configs for a benchmark, as ``python train.py ...`` would."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, open_dict

from benchmarks.record import REPO_ROOT
from vramkit.core.hardware.resolve import resolve_hardware

CONF_DIR = REPO_ROOT / "conf"
# Benchmark data lives with the project's generated data, so it is rendered once per checkout.
DATA_DIR = REPO_ROOT / "data"


def compose_run_config(*overrides: str, output_dir: Path, resolve: bool = True) -> DictConfig:
    """``conf/train.yaml`` with ``overrides`` and output in ``output_dir``, as ``train.py`` has it.

    With ``resolve`` the hardware profile is resolved into ``cfg.hw`` (what ``train()`` does
    first; leave it to ``train()`` when the config goes there). Generated data goes to the
    repository's ``data/`` folder unless an override moves it.
    """
    os.environ.setdefault("PROJECT_ROOT", str(REPO_ROOT))
    os.environ.setdefault("WANDB_SILENT", "true")
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(
            "train",
            overrides=[f"paths.data_dir={DATA_DIR}", *overrides],
            return_hydra_config=True,
        )
    # resolve_hardware reads the +hw choice from Hydra's runtime config, as under @hydra.main.
    HydraConfig.instance().set_config(cfg)
    with open_dict(cfg):
        cfg.paths.output_dir = str(output_dir)
        cfg.paths.log_dir = str(Path(output_dir) / "logs")
        del cfg.hydra
    if resolve:
        resolve_hardware(cfg, conf_dir=CONF_DIR)
    return cfg


def quiet_libraries() -> None:
    """Keep Lightning's and Hydra's start-up chatter out of the benchmark output."""
    for name in ("lightning", "lightning.pytorch", "lightning.fabric", "vramkit"):
        logging.getLogger(name).setLevel(logging.WARNING)
