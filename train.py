"""Train a task: ``python train.py +hw=t4`` (or no ``+hw`` to detect the machine)."""

import os
from pathlib import Path

import hydra
from omegaconf import DictConfig

from vramkit.core.run.train import train

os.environ.setdefault("PROJECT_ROOT", str(Path(__file__).resolve().parent))


@hydra.main(version_base="1.3", config_path="conf", config_name="train")
def main(cfg: DictConfig) -> float | None:
    return train(cfg)


if __name__ == "__main__":
    main()
