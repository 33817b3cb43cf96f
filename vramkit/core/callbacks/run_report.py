"""report.html and its pictures in the run folder at the end of every fit (also a stopped one)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Literal

import lightning as L
import torch
from lightning.pytorch.loggers import WandbLogger
from pydantic import Field

from vramkit.core.config.settings import ConfigPath, Settings
from vramkit.core.report.build import REPORT_DIR, build_report
from vramkit.core.report.task_figures import DrawsReportFigures, save_task_figure

log = logging.getLogger(__name__)


class RunReportSettings(Settings):
    """The keys of ``callbacks.run_report`` (conf/callbacks/run_report.yaml)."""

    dirpath: ConfigPath
    """The run folder: report.html goes into it, the PNGs into its report/ subfolder."""
    task_figures: bool = True
    """Ask the LightningModule for its pictures (``report_figures``) at the end of the fit."""
    samples: int = Field(3, ge=1, le=32)
    """Validation samples of each kind a task picture shows (best, worst, random, ...)."""
    wandb_media: bool = True
    """Send the task pictures (and the planned/measured memory chart) to WandB as images."""
    summary_metric: str | None = None
    """A metric whose best value WandB keeps as the run's summary (define_metric)."""
    summary_mode: Literal["max", "min"] = "max"
    """Whether the best value of ``summary_metric`` is its largest or its smallest."""


class RunReport(L.Callback):
    """Writes ``report.html`` into the run folder when a fit ends, and rebuilds it when one fails.

    At the end of a fit (``max_epochs``, ``max_time``, early stopping or a stop signal all end
    it there) the LightningModule draws its task pictures when it implements
    :class:`~vramkit.core.report.task_figures.DrawsReportFigures`; then the curves are drawn
    from the CSV logger's file. A fit that raises (an interrupt, an error) still gets the curves
    of what it logged, without task pictures: the model may be in no state to predict. Only
    global rank 0 writes. A report that cannot be built is a warning, never a failed run.
    ``python -m vramkit.report RUN_DIR`` rebuilds the same page from the folder.

    Its keys are the fields of `RunReportSettings`, given as keyword arguments
    and kept validated in ``self.settings`` (see `vramkit.core.config.settings`).
    """

    settings_class = RunReportSettings

    def __init__(self, **settings: Any) -> None:
        self.settings = RunReportSettings.for_component(type(self), settings)
        self.report_path: Path | None = None  # set once a report was written (for tests, logs)

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.settings.summary_metric is None or not trainer.is_global_zero:
            return
        for logger in trainer.loggers:
            if isinstance(logger, WandbLogger):
                # WandB's summary would otherwise hold the last value, not the best one
                logger.experiment.define_metric(
                    self.settings.summary_metric, summary=self.settings.summary_mode
                )

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._write(trainer, pl_module, draw_task=self.settings.task_figures)

    def on_exception(
        self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException
    ) -> None:
        self._write(trainer, pl_module, draw_task=False)

    def _write(self, trainer: L.Trainer, pl_module: L.LightningModule, draw_task: bool) -> None:
        if not trainer.is_global_zero:
            return
        run_dir = Path(self.settings.dirpath)
        try:
            for logger in trainer.loggers:
                logger.save()  # the CSV logger buffers rows; the report reads its file
            pictures = self._task_pictures(trainer, pl_module) if draw_task else []
            self.report_path = build_report(run_dir)
        except Exception as error:  # a finished fit must not fail for its report
            log.warning(
                "run report not written to %s: %s: %s", run_dir, type(error).__name__, error
            )
            return
        log.info("run report: %s", self.report_path)
        memory = run_dir / REPORT_DIR / "memory_plan.png"
        if memory.exists():
            # the one chart WandB cannot draw from the logged metrics: plan beside measurement
            pictures.append((memory, "peak memory per phase: measured and planned"))
        if self.settings.wandb_media and pictures:
            self._send_to_wandb(trainer, pictures)

    def _task_pictures(
        self, trainer: L.Trainer, pl_module: L.LightningModule
    ) -> list[tuple[Path, str]]:
        if not isinstance(pl_module, DrawsReportFigures):
            return []
        was_training = pl_module.training
        pl_module.eval()
        try:
            with torch.no_grad():
                figures = pl_module.report_figures(trainer, self.settings.samples)
        except Exception as error:
            log.warning("task pictures not drawn: %s: %s", type(error).__name__, error)
            return []
        finally:
            pl_module.train(was_training)
        folder = Path(self.settings.dirpath) / REPORT_DIR
        return [(save_task_figure(figure, folder), figure.title) for figure in figures]

    @staticmethod
    def _send_to_wandb(trainer: L.Trainer, pictures: list[tuple[Path, str]]) -> None:
        for logger in trainer.loggers:
            if not isinstance(logger, WandbLogger):
                continue
            for path, title in pictures:
                logger.log_image(key=f"report/{path.stem}", images=[str(path)], caption=[title])
