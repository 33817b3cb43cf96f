"""Fixtures shared by the whole suite: composed configs and the real ICDAR 2015 toy data."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, open_dict

REPO_ROOT = Path(__file__).resolve().parents[1]
CONF_DIR = REPO_ROOT / "conf"
TOY_ICDAR_DIR = REPO_ROOT / "tests" / "data" / "icdar2015_toy"

os.environ.setdefault("PROJECT_ROOT", str(REPO_ROOT))
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
        GlobalHydra.instance().clear()
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            cfg = compose(config_name, overrides=list(overrides), return_hydra_config=True)
        HydraConfig.instance().set_config(cfg)
        with open_dict(cfg):
            cfg.paths.output_dir = str(tmp_path / "run")
            cfg.paths.log_dir = str(tmp_path / "logs")
            cfg.paths.data_dir = str(shared_data_dir)
            del cfg.hydra
        return cfg

    yield _compose
    GlobalHydra.instance().clear()
    HydraConfig.instance().cfg = None  # later tests must not see this run's Hydra settings
