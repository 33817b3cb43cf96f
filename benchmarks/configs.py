"""Compose the project's Hydra configs for a benchmark, as ``python train.py ...`` would."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from omegaconf import DictConfig, open_dict

from benchmarks.record import REPO_ROOT
from vramkit.core.run.compose import CONF_DIR, compose_config
from vramkit.core.run.resolve_hardware import resolve_hardware

# Benchmark data lives with the project's generated data, so it is rendered once per checkout.
DATA_DIR = REPO_ROOT / "data"


def compose_run_config(*overrides: str, output_dir: Path, resolve: bool = True) -> DictConfig:
    """``conf/train.yaml`` with ``overrides`` and output in ``output_dir``, as ``train.py`` has it.

    With ``resolve`` the hardware profile is resolved into ``cfg.hw`` (what ``train()`` does
    first; leave it to ``train()`` when the config goes there). Generated data goes to the
    repository's ``data/`` folder unless an override moves it.
    """
    os.environ.setdefault("WANDB_SILENT", "true")
    cfg = compose_config(
        "train", [f"paths.data_dir={DATA_DIR}", *overrides], output_dir=Path(output_dir)
    )
    with open_dict(cfg):
        cfg.paths.log_dir = str(Path(output_dir) / "logs")
    if resolve:
        resolve_hardware(cfg, conf_dir=CONF_DIR)
    return cfg


def quiet_libraries() -> None:
    """Keep Lightning's and Hydra's start-up chatter out of the benchmark output."""
    for name in ("lightning", "lightning.pytorch", "lightning.fabric", "vramkit"):
        logging.getLogger(name).setLevel(logging.WARNING)
