"""eval.py and scripts/export.py each name one folder of their own, and no training-run folder."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra.core.hydra_config import HydraConfig

from vramkit.core.run.settling import compose


@pytest.mark.parametrize("config_name", ["eval", "export"])
def test_one_folder_per_call_below_its_own_kind(config_name, tmp_path, monkeypatch):
    monkeypatch.setenv("PROJECT_ROOT", str(tmp_path))  # logs/ below tmp_path, as paths.root_dir
    try:
        compose.compose_config(config_name, ["+hw=cpu", "ckpt_path=model.ckpt"])
        # composing claims nothing: the old eval.yaml set hydra.run.dir over default.yaml's
        # ${run_folder:...}, which OmegaConf resolved while merging (one empty runs/ folder)
        assert not (tmp_path / "logs").exists()
        folder = Path(HydraConfig.get().run.dir)
        assert not (tmp_path / "logs").exists(), "reading the folder's name created it"
    finally:
        compose.forget_composition()
    assert folder.parent == tmp_path / "logs" / "text_detection" / f"{config_name}s"
