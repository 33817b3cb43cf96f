"""A disk that fills up during a run ends it with one message naming the folder, the free and
the needed bytes, as its last line, and the previous checkpoint intact and resumable."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from vramkit.core.run.refusal.exit_codes import EXIT_REFUSED, refusals_as_messages
from vramkit.core.run.train import train

TINY = ("+hw=cpu", "debug=smoke", "logger=csv", "callbacks.progress_bar.refresh_rate=0")


@pytest.mark.slow
def test_a_full_disk_ends_the_run_with_its_message_and_keeps_the_last_checkpoint(
    compose_config, capsys, monkeypatch
):
    monkeypatch.setattr(shutil, "disk_usage", shutil.disk_usage)  # restored whatever happens
    cfg = compose_config(
        *TINY,
        "trainer.max_epochs=2",
        "data.num_workers=0",
        "callbacks.last_checkpoint.every_n_train_steps=2",
        "callbacks.last_checkpoint.min_interval_s=0",
        "+callbacks.drill._target_=drill_callbacks.FillDisk",
        "+callbacks.drill.step=3",  # after the write at step 2, before the one at step 4
    )
    with pytest.raises(SystemExit) as stopped, refusals_as_messages():
        train(cfg)
    assert stopped.value.code == EXIT_REFUSED
    last_line = capsys.readouterr().err.strip().splitlines()[-1]
    checkpoints = Path(cfg.paths.output_dir) / "checkpoints"
    assert last_line.startswith("error: not enough disk space for checkpoint last.ckpt")
    assert str(checkpoints) in last_line and "0.0 MiB free" in last_line
    saved = torch.load(checkpoints / "last.ckpt", weights_only=True)
    assert saved["global_step"] == 2
    assert not [p for p in checkpoints.iterdir() if p.name.startswith(".")]
    assert shutil.disk_usage(checkpoints).free > 0, "the drill ends with the run"
