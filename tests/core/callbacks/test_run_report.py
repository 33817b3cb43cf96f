"""RunReport writes report.html after a fit (task pictures included) and after a failed one."""

from __future__ import annotations

import re
from unittest import mock

import lightning as L
import pytest
import torch
from lightning.pytorch.loggers import CSVLogger, WandbLogger
from matplotlib.figure import Figure
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from vramkit.core.callbacks.run_report import RunReport
from vramkit.core.config.schema import ConfigError
from vramkit.core.report.task_figures import ReportFigure


def _loader() -> DataLoader:
    return DataLoader(TensorDataset(torch.randn(8, 2), torch.randn(8, 1)), batch_size=4)


class _Regression(L.LightningModule):
    def __init__(self, fail_at_step: int | None = None) -> None:
        super().__init__()
        self.layer = nn.Linear(2, 1)
        self.fail_at_step = fail_at_step
        self.drawn_in_eval_mode: bool | None = None

    def training_step(self, batch, batch_idx):
        if self.global_step == self.fail_at_step:
            raise RuntimeError("injected failure")
        loss = nn.functional.mse_loss(self.layer(batch[0]), batch[1])
        self.log("train/loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        self.log("val/loss", nn.functional.mse_loss(self.layer(batch[0]), batch[1]))
        self.log("mem/val_peak_gib", 0.5)  # as the memory monitor logs it

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def report_figures(self, trainer, samples):
        self.drawn_in_eval_mode = not self.training and not torch.is_grad_enabled()
        figure = Figure(figsize=(2, 2))
        figure.subplots().plot(range(samples), range(samples))
        return [ReportFigure("line", "A line", figure, f"{samples} points")]


def _fit(tmp_path, module, report, loggers=None):
    trainer = L.Trainer(
        accelerator="cpu",
        max_epochs=1,
        limit_train_batches=2,
        limit_val_batches=1,
        log_every_n_steps=1,
        logger=loggers or CSVLogger(tmp_path, name="csv"),
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        callbacks=[report],
    )
    trainer.fit(module, _loader(), _loader())
    return trainer


def test_a_fit_leaves_report_html_with_curves_and_task_pictures(tmp_path):
    report = RunReport(dirpath=tmp_path, samples=2)
    module = _Regression()
    _fit(tmp_path, module, report)
    assert report.report_path == tmp_path / "report.html"
    html = report.report_path.read_text()
    images = re.findall(r'<img src="([^"]+)"', html)
    assert "report/loss.png" in images and "report/task_line.png" in images
    assert all((tmp_path / image).stat().st_size > 1000 for image in images)
    assert "A line: 2 points" in html
    assert module.drawn_in_eval_mode and module.training  # drawn in eval, handed back in train


def test_a_failed_fit_still_gets_the_curves_it_logged(tmp_path):
    report = RunReport(dirpath=tmp_path)
    with pytest.raises(RuntimeError, match="injected failure"):
        _fit(tmp_path, _Regression(fail_at_step=1), report)
    html = (tmp_path / "report.html").read_text()
    assert "report/loss.png" in html  # step 0's loss was flushed and drawn
    assert "task_line" not in html  # no predictions from a model in an unknown state


def test_task_pictures_go_to_wandb_and_the_best_metric_is_its_summary(tmp_path):
    wandb_logger = mock.MagicMock(spec=WandbLogger)
    report = RunReport(dirpath=tmp_path, summary_metric="val/loss", summary_mode="min")
    _fit(tmp_path, _Regression(), report, loggers=[CSVLogger(tmp_path, name="csv"), wandb_logger])
    wandb_logger.experiment.define_metric.assert_called_once_with("val/loss", summary="min")
    sent = {
        call.kwargs["key"]: call.kwargs["images"] for call in wandb_logger.log_image.call_args_list
    }
    assert sent == {
        "report/task_line": [str(tmp_path / "report" / "task_line.png")],
        "report/memory_plan": [str(tmp_path / "report" / "memory_plan.png")],
    }


def test_a_bad_setting_is_refused_with_its_key():
    with pytest.raises(ConfigError, match=r"callbacks\.run_report\.summary_mode"):
        RunReport(dirpath="x", summary_mode="best")
