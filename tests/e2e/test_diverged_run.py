"""A run whose weights turn NaN mid-training stops at once with one message naming the step, the
epoch and the last finite checkpoint, exits with status 3, and leaves no NaN checkpoint."""

from __future__ import annotations

import math
from pathlib import Path

import lightning as L
import pytest
import torch

from vramkit.core.run.refusals import EXIT_DIVERGED, refusals_as_messages
from vramkit.core.run.train import train

TINY = ("+hw=cpu", "debug=smoke", "logger=csv", "callbacks.progress_bar.refresh_rate=0")


class NaNWeightsAt(L.Callback):
    """Fills every weight with NaN before the batch of optimizer step ``step`` (0-based), as a
    diverging update would, so that batch's loss and gradients are NaN."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, *_) -> None:
        if trainer.global_step == self.step:
            with torch.no_grad():
                for parameter in pl_module.parameters():
                    parameter.fill_(math.nan)


@pytest.mark.slow
def test_a_diverged_run_stops_with_its_last_finite_checkpoint_intact(compose_config, capsys):
    cfg = compose_config(
        *TINY,
        "trainer.max_epochs=2",  # 4 steps per epoch: the NaN comes in the second
        "data.num_workers=0",
        "callbacks.last_checkpoint.every_n_train_steps=1",
        "callbacks.last_checkpoint.min_interval_s=0",
        "+callbacks.drill._target_=test_diverged_run.NaNWeightsAt",
        "+callbacks.drill.step=5",
    )
    with pytest.raises(SystemExit) as stopped, refusals_as_messages():
        train(cfg)
    assert stopped.value.code == EXIT_DIVERGED
    checkpoints = Path(cfg.paths.output_dir) / "checkpoints"
    last = checkpoints / "last.ckpt"
    message = capsys.readouterr().err.strip().splitlines()[-1]
    assert message.startswith("error: training diverged: non-finite gradients at step 6 (epoch 1)")
    assert f"the last finite checkpoint is {last}" in message
    assert torch.load(last, weights_only=True)["global_step"] == 5
    files = sorted(checkpoints.glob("*.ckpt"))
    assert [p.name for p in files] == ["epoch_000.ckpt", "last.ckpt"]
    for path in files:
        weights = torch.load(path, weights_only=True)["state_dict"].values()
        assert all(bool(torch.isfinite(t).all()) for t in weights if t.is_floating_point())
