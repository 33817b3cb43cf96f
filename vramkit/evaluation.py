"""``evaluate(cfg)``: what ``python eval.py`` does: metrics and ICDAR 2015 submission files."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import lightning as L
from omegaconf import DictConfig

from vramkit.hardware.profile import describe_profile
from vramkit.hardware.resolve import resolve_hardware
from vramkit.instantiate import instantiate, instantiate_group
from vramkit.lightning_modules.text_detection import TextDetectionModule
from vramkit.ocr.icdar_format import write_detections
from vramkit.run_logging import finish_wandb

log = logging.getLogger(__name__)


def evaluate(cfg: DictConfig) -> dict[str, float]:
    """Validate ``cfg.ckpt_path``; for text detection also write ``res_<name>.txt`` files.

    The files follow the ICDAR 2015 submission format, so
    ``python -m vramkit.ocr.evaluate <val gt dir> <predictions dir>`` reproduces the metrics.
    """
    checkpoint = Path(cfg.ckpt_path)
    if not checkpoint.is_file():
        raise FileNotFoundError(f"ckpt_path: no checkpoint file at {checkpoint}")
    # Evaluation never trains: a planner's training-phase search would only cost time.
    profile = resolve_hardware(cfg, conf_dir=Path(cfg.paths.conf_dir), plan_batches=False)
    log.info("Hardware profile\n%s", describe_profile(profile))
    if cfg.get("seed") is not None:
        L.seed_everything(cfg.seed, workers=True)

    datamodule = instantiate(cfg.data)
    model = instantiate(cfg.model)
    loggers = instantiate_group(cfg.get("logger"))
    trainer: L.Trainer = instantiate(cfg.trainer, logger=loggers or False, callbacks=[])
    try:
        (metrics,) = trainer.validate(model, datamodule=datamodule, ckpt_path=str(checkpoint))
        if isinstance(model, TextDetectionModule):
            predictions = trainer.predict(model, datamodule=datamodule, ckpt_path=str(checkpoint))
            _write_submissions(predictions, Path(cfg.predictions_dir))
    finally:
        finish_wandb()
    result = {name: float(value) for name, value in metrics.items()}
    print(json.dumps(result))
    return result


def _write_submissions(predictions: list[dict[str, list]], predictions_dir: Path) -> None:
    predictions_dir.mkdir(parents=True, exist_ok=True)
    written = 0
    for batch in predictions:
        for name, boxes, scores in zip(
            batch["names"], batch["boxes"], batch["scores"], strict=True
        ):
            write_detections(predictions_dir / f"res_{name}.txt", boxes, scores)
            written += 1
    log.info("wrote %d submission files to %s", written, predictions_dir)
