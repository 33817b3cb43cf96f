"""The learning-rate monitor logs on exactly the steps Lightning's own does."""

from __future__ import annotations

from typing import Any

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import LearningRateMonitor
from lightning.pytorch.loggers import Logger

from tests.core.callbacks.tiny_regression import TinyRegression, regression_loader
from vramkit.core.callbacks.learning_rate_monitor import StepLearningRateMonitor


class _Recorder(Logger):
    """Keeps the step of every learning-rate row."""

    def __init__(self) -> None:
        super().__init__()
        self.lr_steps: list[int] = []

    @property
    def name(self) -> str:
        return "recorder"

    @property
    def version(self) -> int:
        return 0

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        if any(key.startswith("lr-") for key in metrics):
            self.lr_steps.append(step)

    def log_hyperparams(self, *args: Any, **kwargs: Any) -> None:
        pass


class _Decaying(TinyRegression):
    """The regression with a learning rate that decays every step."""

    def configure_optimizers(self) -> dict[str, Any]:
        optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
        schedule = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.9)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}


def _logged_steps(tmp_path, monitor: L.Callback, every: int, max_steps: int) -> list[int]:
    recorder = _Recorder()
    trainer = L.Trainer(
        accelerator="cpu",
        max_steps=max_steps,
        log_every_n_steps=every,
        logger=recorder,
        callbacks=[monitor],
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
    )
    trainer.fit(_Decaying(), regression_loader(40, 4))  # 10 batches per epoch
    return recorder.lr_steps


@pytest.mark.parametrize(("every", "max_steps"), [(3, 25), (1, 7), (10, 35)])
def test_logs_on_the_steps_lightnings_monitor_logs(tmp_path, every, max_steps):
    ours = _logged_steps(
        tmp_path, StepLearningRateMonitor(logging_interval="step"), every, max_steps
    )
    theirs = _logged_steps(tmp_path, LearningRateMonitor(logging_interval="step"), every, max_steps)
    assert ours == theirs
    assert len(ours) >= max_steps // every - 1  # it logged at all
