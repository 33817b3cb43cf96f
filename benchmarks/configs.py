"""Compose the project's Hydra configs for a benchmark, as ``python train.py ...`` would."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from omegaconf import DictConfig

from benchmarks.record import REPO_ROOT
from vramkit.core.run.compose import compose_config
from vramkit.core.run.settle import settle, settled_config

# Benchmark data lives with the project's generated data, so it is rendered once per checkout.
DATA_DIR = REPO_ROOT / "data"


def compose_run_config(*overrides: str, output_dir: Path, resolve: bool = True) -> DictConfig:
    """``conf/train.yaml`` with ``overrides`` and output in ``output_dir``, as ``train.py`` has it.

    With ``resolve`` the config is settled and composed again (what ``train()`` does first: the
    run's config, batch sizes explicit); leave that to ``train()`` when the config goes there.
    Generated data goes to the repository's ``data/`` folder unless an override moves it.
    """
    os.environ.setdefault("WANDB_SILENT", "true")
    paths = (f"paths.data_dir={DATA_DIR}", f"paths.log_dir={Path(output_dir) / 'logs'}")
    cfg = compose_config("train", [*paths, *overrides], output_dir=Path(output_dir))
    if resolve:
        cfg = settled_config(settle(cfg))
    return cfg


def quiet_libraries() -> None:
    """Keep Lightning's and Hydra's start-up chatter out of the benchmark output."""
    for name in ("lightning", "lightning.pytorch", "lightning.fabric", "vramkit"):
        logging.getLogger(name).setLevel(logging.WARNING)
