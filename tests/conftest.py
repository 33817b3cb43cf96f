"""Fixtures shared by the whole suite: composed configs and the real ICDAR 2015 toy data."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from omegaconf import DictConfig, open_dict

from vramkit.core.run import compose

TOY_ICDAR_DIR = Path(__file__).resolve().parent / "data" / "icdar2015_toy"

os.environ.setdefault("WANDB_SILENT", "true")
# Two cores, possibly two pytest workers: one intra-op thread each avoids oversubscription.
torch.set_num_threads(1)


@pytest.fixture(scope="session")
def toy_icdar_dir() -> Path:
    """The 7 real ICDAR 2015 images with their ground truth (images/, gt/)."""
    if not TOY_ICDAR_DIR.is_dir():
        pytest.fail(f"the toy ICDAR data is missing: {TOY_ICDAR_DIR}")
    return TOY_ICDAR_DIR


@pytest.fixture(scope="session")
def shared_data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data folder shared by the tests of one session, so tiny datasets are rendered once."""
    return tmp_path_factory.mktemp("data")


@pytest.fixture
def compose_config(tmp_path: Path, shared_data_dir: Path) -> Iterator[Callable[..., DictConfig]]:
    """Compose ``conf/<name>.yaml`` with overrides, as ``python train.py ...`` would.

    The run's output goes to this test's tmp_path and generated data to the session's data folder.
    """

    def _compose(*overrides: str, config_name: str = "train") -> DictConfig:
        cfg = compose.compose_config(config_name, overrides, output_dir=tmp_path / "run")
        with open_dict(cfg):
            cfg.paths.log_dir = str(tmp_path / "logs")
            cfg.paths.data_dir = str(shared_data_dir)
        return cfg

    yield _compose
    compose.forget_composition()  # later tests must not see this run's Hydra settings
