"""``train(cfg)``: what ``python train.py`` does, as a plain function tests and sweeps can call."""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path

import lightning as L
from lightning.pytorch.utilities import rank_zero_only
from omegaconf import DictConfig, OmegaConf, open_dict

from vramkit.core.callbacks.checkpoints.checkpoint_contract import CheckpointContract
from vramkit.core.config.added_keys import check_added_keys
from vramkit.core.config.component_settings import check_component_settings
from vramkit.core.config.instantiate import instantiate, instantiate_group
from vramkit.core.config.monitored_metrics import check_monitored_metrics
from vramkit.core.config.source import command_line_overrides
from vramkit.core.config.trainer_schema import check_trainer
from vramkit.core.distributed.rank_zero_logging import quiet_other_processes
from vramkit.core.distributed.sync_batchnorm import (
    cpu_sync_batchnorm_arguments,
    needs_cpu_sync_batchnorm,
)
from vramkit.core.run.folder.requeue import requeued_checkpoint
from vramkit.core.run.folder.run_folder import RUN_CONFIG, RUN_OVERRIDES, record_name
from vramkit.core.run.library_chatter import hide_library_chatter, output_settings
from vramkit.core.run.loggers import finish_wandb, log_config
from vramkit.core.run.records.run_record import RECORD_NAME, write_run_record
from vramkit.core.run.records.run_summary import summary_lines
from vramkit.core.run.resume_contract import (
    ResumeVerdict,
    check_resume,
    keep_trained_batch,
    load_initial_weights,
    resume_settings,
    run_contract,
)
from vramkit.core.run.run_folder_guard import claim_job_folder
from vramkit.core.run.seed import check_seed
from vramkit.core.run.settling.compose import settled_config
from vramkit.core.run.settling.fit_to_budget import write_fit_decision
from vramkit.core.run.settling.settle import Settlement, log_decisions, settle, write_overrides
from vramkit.core.trainer_assembly.working_set import keep_working_callbacks
from vramkit.core.workload import check_workload

log = logging.getLogger(__name__)


def train(cfg: DictConfig) -> float | None:
    """Fit the task's model on its data with the hardware profile's settings.

    `cfg` is what the user's overrides compose to (``@hydra.main``'s, or `compose_config`'s); the
    run's config is composed again from those overrides plus the settlement's, so a change made to
    `cfg` in code does not reach the run: give it as an override. Returns the value of
    ``cfg.optimized_metric`` for the best checkpoint (or the last epoch when no checkpoint ranks
    them), which is what a Hydra sweep optimises.
    """
    quiet_other_processes()  # a DDP process of rank > 0 repeats rank 0's lines
    claim_job_folder(os.environ)  # a sweep's job owns its folder as a single run does
    # Other libraries' chatter off unless verbose=true (a bad value is refused here, before work).
    hide_library_chatter(output_settings(cfg.get("verbose"), config_file="conf/train.yaml"))
    # Mistakes first, then hardware: a bad value, a misspelt key or a profile the machine cannot
    # honour must stop the run before any planning, data or model work.
    refuse_mistakes(cfg)
    # The checkpoint's verdict (the Hydra callback refused a wrong one before any folder): the
    # changes a resume applies, recorded in the run's config as resume.changes.
    verdict = check_resume(cfg)
    # Settle, then compose: the profile's open values decided as overrides, and the run's config
    # composed again from the user's overrides plus those (vramkit.core.run.settling.settle).
    settlement = settle(cfg, applied=verdict.overrides)
    # A resume trains the checkpoint's samples per step, whatever this machine fits now.
    settlement = keep_trained_batch(cfg, settlement)
    contract = run_contract(cfg, settlement.profile)
    cfg = settled_config(settlement)
    _say_decisions(settlement, verdict)
    requeued = requeued_checkpoint(cfg, os.environ)
    if requeued is not None:  # recorded in the run's config like a resume the user asked for
        log.warning("a requeued job: resuming from %s", requeued)
        with open_dict(cfg):
            cfg.ckpt_path = str(requeued)
    _record_config(cfg, Path(cfg.paths.output_dir), settlement)

    if cfg.get("seed") is not None:
        # verbose=False: no 'Seed set to 42' line; the seed is in the run's config
        L.seed_everything(cfg.seed, workers=True, verbose=False)

    datamodule = instantiate(cfg.data)
    model = instantiate(cfg.model)
    if cfg.get("init_from"):  # a new run from trained weights, with a fresh optimizer and schedule
        load_initial_weights(model, cfg.init_from)
        log.info("initial weights from %s", cfg.init_from)
    callbacks = instantiate_group(cfg.get("callbacks"))
    allow_changes = resume_settings(cfg).allow_changes
    callbacks.append(CheckpointContract(contract, allow_changes=allow_changes))
    loggers = instantiate_group(cfg.get("logger"))
    trainer: L.Trainer = instantiate(
        cfg.trainer, callbacks=callbacks, logger=loggers or False, **_layer_sync(cfg.trainer)
    )
    # callbacks with nothing to do in this run would cost every step
    keep_working_callbacks(trainer, datamodule)
    try:
        log_config(trainer, cfg)
        if cfg.get("train", True):
            # weights_only=True explicitly: Lightning's None lets TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD
            # unpickle anything (vramkit.core.io.safe_load); the checkpoint was already read
            # that way by the resume contract before any folder was touched.
            trainer.fit(
                model, datamodule=datamodule, ckpt_path=cfg.get("ckpt_path"), weights_only=True
            )
        result = _optimized_metric(trainer, cfg.get("optimized_metric"))
    finally:
        finish_wandb()
    if cfg.get("train", True):
        _log_summary(trainer)  # last, after the loggers' own closing output
    return result


def refuse_mistakes(cfg: DictConfig) -> None:
    """Raise `ConfigError` for a mistake that needs no device, plan, data or model to see: a
    trainer value, a misspelt added key, a component's setting (a callback's key or value), a
    workload that breaks its contract, a monitored metric the task never logs, the seed."""
    check_trainer(cfg.trainer)
    check_added_keys(cfg, command_line_overrides(), conf_dir=Path(cfg.paths.conf_dir))
    check_component_settings(cfg)
    check_workload(cfg)  # before the metrics: they are read from the model class it checks
    check_monitored_metrics(cfg)
    check_seed(cfg)


def _layer_sync(trainer: DictConfig) -> dict:
    # torch's SyncBatchNorm refuses CPU tensors: CPU processes (trainer=ddp_sim) get ours
    if not needs_cpu_sync_batchnorm(trainer):
        return {}
    return cpu_sync_batchnorm_arguments(
        [instantiate(node) for node in trainer.get("plugins") or []]
    )


@rank_zero_only
def _log_summary(trainer: L.Trainer) -> None:
    for line in summary_lines(trainer):
        log.info(line)


@rank_zero_only
def _say_decisions(settlement: Settlement, verdict: ResumeVerdict) -> None:
    # Everything the run decided before building anything, once, in the order it was decided.
    for line in verdict.lines:
        print(line, file=sys.stderr)
    log_decisions(settlement)
    log.info("Hardware profile\n%s", settlement)


@rank_zero_only
def _record_config(cfg: DictConfig, output_dir: Path, settlement: Settlement) -> None:
    # Once per run, not per DDP process; a resumed run keeps the first run's record.
    output_dir.mkdir(parents=True, exist_ok=True)
    if settlement.remedy_record is not None:
        write_fit_decision(output_dir, settlement.remedy_record)
    if settlement.memory_plan is not None:
        _write_memory_plan(output_dir, settlement.memory_plan)
    write_overrides(output_dir, settlement, record_name(output_dir, RUN_OVERRIDES))
    config_name = record_name(output_dir, RUN_CONFIG)
    (output_dir / config_name).write_text(OmegaConf.to_yaml(cfg, resolve=True))
    write_run_record(
        output_dir, repo=Path(cfg.paths.root_dir), name=record_name(output_dir, RECORD_NAME)
    )
    if cfg.get("ckpt_path"):
        log.info(
            "resuming %s; this run writes into %s (%s)", cfg.ckpt_path, output_dir, config_name
        )


def _write_memory_plan(output_dir: Path, predictions: dict) -> None:
    """The planner's predicted peaks beside the run's measured ones: report.html draws both."""
    # Imported here: only runs that planned write the file.
    from vramkit.core.report.build import MEMORY_PLAN

    # A resumed run's plan goes beside the first run's (memory_plan.resume_1.json), which the
    # report keeps reading.
    resumed = (output_dir / RUN_CONFIG).is_file()
    name = record_name(output_dir, MEMORY_PLAN) if resumed else MEMORY_PLAN
    (output_dir / name).write_text(json.dumps(predictions, indent=2) + "\n")


def _optimized_metric(trainer: L.Trainer, name: str | None) -> float | None:
    if name is None:
        return None
    checkpoint = trainer.checkpoint_callback
    if (
        checkpoint is not None
        and getattr(checkpoint, "monitor", None) == name
        and checkpoint.best_model_score is not None
    ):
        return float(checkpoint.best_model_score)
    value = trainer.callback_metrics.get(name)
    if value is None:
        log.warning(
            "optimized_metric %r was never logged; known metrics: %s",
            name,
            sorted(trainer.callback_metrics),
        )
        return None
    return float(value)
