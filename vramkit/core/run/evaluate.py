"""``evaluate(cfg)``: what ``python eval.py`` does: metrics and ICDAR 2015 submission files."""

from __future__ import annotations

import json
import logging
import signal
from pathlib import Path

import lightning as L
from omegaconf import DictConfig

from vramkit.core.callbacks.stop_signals import rerun_command, stops_at_once
from vramkit.core.config.instantiate import instantiate, instantiate_group
from vramkit.core.io.checkpoint_io import atomic_write_bytes
from vramkit.core.run.eval_backend import backend_settings, prepare_model
from vramkit.core.run.library_chatter import hide_library_chatter, output_settings
from vramkit.core.run.loggers import finish_wandb
from vramkit.core.run.resume_contract import check_resume
from vramkit.core.run.settling.compose import settled_config
from vramkit.core.run.settling.settle import log_decisions, settle

log = logging.getLogger(__name__)

SCORES_NAME = "scores.json"
"""The metrics of an evaluation, written into its folder (``logs/<task>/evals/<time>/``)."""


def evaluate(cfg: DictConfig) -> dict[str, float]:
    """Validate ``cfg.ckpt_path`` (or, with ``backend=onnxruntime``, ``cfg.onnx_path``) and
    return its metrics.

    A task whose config has a ``prediction_writer`` node (text detection: ICDAR 2015
    ``res_<name>.txt`` files) also predicts, and the writer saves the predictions into
    ``cfg.predictions_dir``. The metrics are also written to ``scores.json`` in the run folder,
    last and atomically: a folder with ``scores.json`` holds a finished evaluation.

    SIGTERM or SIGINT stops it at once with exit status 143 / 130 (never 0, so a scheduler never
    records a stopped evaluation as done) and one line naming the command to run again.
    """
    with stops_at_once(_stopped):
        return _evaluate(cfg)


def _stopped(received: signal.Signals) -> str:
    return (
        f"{received.name}: the evaluation stopped before it finished and wrote no {SCORES_NAME} "
        f"(predictions, if any, are incomplete); run it again: {rerun_command('eval.py')}"
    )


def _evaluate(cfg: DictConfig) -> dict[str, float]:
    # Other libraries' chatter off unless verbose=true (a bad value is refused here, before work).
    hide_library_chatter(output_settings(cfg.get("verbose"), config_file="conf/eval.yaml"))
    backend = backend_settings(cfg)
    check_resume(cfg)  # a readable checkpoint of this task and model, checked first
    # Evaluation never trains: only the inference phase is planned (its batch size on a GPU).
    # onnxruntime runs the network on the CPU (onnx_inference.py): nothing to plan on the GPU.
    settlement = settle(cfg, plan_batches=False, plan_inference=backend.backend == "torch")
    cfg = settled_config(settlement)
    log_decisions(settlement)
    log.info("Hardware profile\n%s", settlement)
    if cfg.get("seed") is not None:
        # verbose=False: no 'Seed set to 42' line; the seed is in the run's config
        L.seed_everything(cfg.seed, workers=True, verbose=False)

    datamodule = instantiate(cfg.data)
    model = prepare_model(cfg, instantiate(cfg.model), backend)
    loggers = instantiate_group(cfg.get("logger"))
    writer_node = cfg.get("prediction_writer")
    callbacks = (
        [] if writer_node is None else [instantiate(writer_node, output_dir=cfg.predictions_dir)]
    )
    trainer: L.Trainer = instantiate(cfg.trainer, logger=loggers or False, callbacks=callbacks)
    try:
        (metrics,) = trainer.validate(model, datamodule=datamodule)
        if callbacks:
            trainer.predict(model, datamodule=datamodule, return_predictions=False)
    finally:
        finish_wandb()
    result = {name: float(value) for name, value in metrics.items()}
    scores = Path(cfg.paths.output_dir) / SCORES_NAME
    atomic_write_bytes(scores, (json.dumps(result, indent=2) + "\n").encode("utf-8"))
    log.info("evaluated with backend=%s; scores in %s", backend.backend, scores)
    print(json.dumps(result))
    return result
