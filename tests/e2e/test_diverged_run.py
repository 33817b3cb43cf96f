"""A run whose weights turn NaN mid-training stops at once with one message naming the step, the
epoch and the last finite checkpoint, exits with status 3, and leaves no NaN checkpoint."""

from __future__ import annotations

import math
import shlex
from pathlib import Path

import lightning as L
import pytest
import torch

from tests.e2e.script_runs import run_script
from vramkit.core.run.refusal.exit_codes import EXIT_DIVERGED, refusals_as_messages
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
    assert "resume it at half the learning rate: python train.py " in message
    assert message.endswith(f"ckpt_path={last} model.optimizer.lr=0.002 resume.allow_changes=true")
    assert torch.load(last, weights_only=True)["global_step"] == 5
    files = sorted(checkpoints.glob("*.ckpt"))
    assert [p.name for p in files] == ["epoch_000.ckpt", "last.ckpt"]
    for path in files:
        weights = torch.load(path, weights_only=True)["state_dict"].values()
        assert all(bool(torch.isfinite(t).all()) for t in weights if t.is_floating_point())


@pytest.mark.slow
def test_the_divergence_messages_resume_command_works_as_printed(tmp_path, shared_data_dir):
    # The drill: the advice ("resume with a smaller learning rate") was refused as a
    # changed setting, and with resume.allow_changes=true it kept the checkpoint's rate and
    # diverged again at the same step. The drill diverges at any peak rate above 0.003.
    first = run_script(
        "train.py",
        *TINY,
        "trainer.max_epochs=2",
        "callbacks.last_checkpoint.every_n_train_steps=1",
        "callbacks.last_checkpoint.min_interval_s=0",
        "+callbacks.drill._target_=drill_callbacks.DivergeAboveRate",
        "+callbacks.drill.rate=0.003",
        "+callbacks.drill.step=5",
        f"paths.log_dir={tmp_path}",
        f"paths.data_dir={shared_data_dir}",
        cwd=tmp_path,
    )
    assert first.returncode == EXIT_DIVERGED, first.stderr[-3000:]
    message = first.stderr.strip().splitlines()[-1]
    printed = message.split("resume it at half the learning rate: ", 1)[1]
    words = shlex.split(printed)
    assert words[:2] == ["python", "train.py"]
    assert "model.optimizer.lr=0.002" in words and "resume.allow_changes=true" in words
    resumed = run_script("train.py", *words[2:], cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resume: applied model.optimizer.lr: 0.004 -> 0.002 to the optimizer" in (
        resumed.stderr + resumed.stdout
    )
    (run,) = (tmp_path / "text_detection" / "runs").iterdir()
    assert torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 8
