"""The WandB logger prints no offline header, and a closed run leaves no empty folder."""

from __future__ import annotations

from pathlib import Path

from vramkit.core.run.loggers import remove_empty_folders
from vramkit.core.run.wandb_logger import WandbLoggerWithoutAnonymous


def test_an_offline_run_is_silent_and_an_online_one_keeps_its_header(tmp_path):
    offline = WandbLoggerWithoutAnonymous(save_dir=str(tmp_path), mode="offline")
    assert offline._wandb_init["settings"].silent is True
    assert "anonymous" not in offline._wandb_init
    online = WandbLoggerWithoutAnonymous(save_dir=str(tmp_path), mode="online")
    assert "settings" not in online._wandb_init


def test_a_users_own_wandb_settings_are_kept(tmp_path):
    import wandb

    mine = wandb.Settings(silent=False)
    logger = WandbLoggerWithoutAnonymous(save_dir=str(tmp_path), mode="offline", settings=mine)
    assert logger._wandb_init["settings"] is mine


def test_empty_folders_go_and_folders_with_files_stay(tmp_path: Path):
    (tmp_path / "tmp" / "code").mkdir(parents=True)
    (tmp_path / "files").mkdir()
    (tmp_path / "files" / "config.yaml").write_text("a: 1\n")
    (tmp_path / "logs" / "empty").mkdir(parents=True)
    remove_empty_folders(tmp_path)
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")) == [
        "files",
        "files/config.yaml",
    ]
    assert tmp_path.is_dir()
