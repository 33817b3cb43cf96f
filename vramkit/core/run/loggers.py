"""What every run sends to its loggers besides metrics, and how it closes them."""

from __future__ import annotations

import sys

import lightning as L
from omegaconf import DictConfig, OmegaConf


def log_config(trainer: L.Trainer, cfg: DictConfig) -> None:
    """Send the resolved config (hardware profile included) to every logger as hyperparameters."""
    container = OmegaConf.to_container(cfg, resolve=True)
    for logger in trainer.loggers:
        logger.log_hyperparams(container)


def finish_wandb() -> None:
    """Close the WandB run, so the next job of a multirun starts a fresh one."""
    wandb = sys.modules.get("wandb")  # only when a logger actually imported it
    if wandb is not None and wandb.run is not None:
        wandb.finish()
