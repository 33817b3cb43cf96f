"""What every run sends to its loggers besides metrics, and how it closes them."""

from __future__ import annotations

import sys
from pathlib import Path

import lightning as L
from omegaconf import DictConfig, OmegaConf


def log_config(trainer: L.Trainer, cfg: DictConfig) -> None:
    """Send the resolved config (hardware profile included) to every logger as hyperparameters."""
    container = OmegaConf.to_container(cfg, resolve=True)
    for logger in trainer.loggers:
        logger.log_hyperparams(container)


def finish_wandb() -> None:
    """Close the WandB run, so the next job of a multirun starts a fresh one, and remove the
    empty folders it leaves in its run folder."""
    wandb = sys.modules.get("wandb")  # only when a logger actually imported it
    if wandb is not None and wandb.run is not None:
        # run.dir is <offline-run-*>/files (wandb/sdk/wandb_settings.py, files_dir)
        run_folder = Path(wandb.run.dir).parent
        wandb.finish()
        remove_empty_folders(run_folder)


def remove_empty_folders(root: Path) -> None:
    """Remove the empty folders below `root`, deepest first (`root` itself stays).

    ``wandb.init`` creates ``tmp/code`` for a notebook's or ``save_code``'s copy of the code
    (wandb/sdk/wandb_init.py, ``setup_run_log_directory``) and leaves it empty otherwise.
    """
    for folder in sorted((p for p in root.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
        if not any(folder.iterdir()):
            folder.rmdir()
