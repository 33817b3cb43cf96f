"""Evaluate a checkpoint: ``python eval.py ckpt_path=<run>/checkpoints/last.ckpt [+hw=t4]``."""

import os
from pathlib import Path

import hydra
from omegaconf import DictConfig

from vramkit.core.run.evaluate import evaluate

os.environ.setdefault("PROJECT_ROOT", str(Path(__file__).resolve().parent))


@hydra.main(version_base="1.3", config_path="conf", config_name="eval")
def main(cfg: DictConfig) -> dict[str, float]:
    return evaluate(cfg)


if __name__ == "__main__":
    main()
