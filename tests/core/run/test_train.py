"""End to end through train(): fast_dev_run, a smoke run as a user sees it, loggers and metric
names, eval, resume (a multirun: test_multirun_summary.py)."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from omegaconf import OmegaConf

from vramkit.core.run.evaluate import SCORES_NAME, evaluate
from vramkit.core.run.folder.run_folder import RUN_OVERRIDES, read_run_overrides
from vramkit.core.run.settling.compose import settled_config
from vramkit.core.run.settling.settle import settle
from vramkit.core.run.train import train
from vramkit.tasks.text_detection.data.synthetic_text import (
    SyntheticTextConfig,
    synthetic_dataset_dir,
)
from vramkit.tasks.text_detection.evaluation.icdar_eval import evaluate_folders
from vramkit.tasks.text_detection.module import TextDetectionModule

REPO_ROOT = Path(__file__).resolve().parents[3]
TINY = ("+hw=cpu", "debug=smoke")


def _metric_names(run_dir: Path) -> set[str]:
    (metrics_csv,) = run_dir.glob("csv/version_*/metrics.csv")
    with metrics_csv.open() as handle:
        return set(next(csv.reader(handle)))


def test_fast_dev_run_of_the_default_task(compose_config):
    cfg = compose_config(
        "+hw=cpu",
        "debug=fdr",
        "data.synthetic.num_train=4",
        "data.synthetic.num_val=2",
        "data.synthetic.image_size=128",
        "data.image_size=128",
        "data.val_image_size=128",
    )
    train(cfg)
    run_dir = Path(cfg.paths.output_dir)
    resolved = yaml.safe_load((run_dir / "resolved_config.yaml").read_text())
    # the recorded overrides repeat the run: the same config, nothing left to settle
    again = settle(compose_config(*read_run_overrides(run_dir / RUN_OVERRIDES)))
    assert again.overrides == ()
    assert OmegaConf.to_container(settled_config(again), resolve=True) == resolved
    assert resolved["data"]["batch_size"] == again.profile.batch_size  # explicit, not "auto"


CHATTER = (
    "💡 Tip:",  # Lightning's litlogger / litmodels advertisements
    "`weights_only` was not set",
    "Trainer already configured with model summary callbacks",
    "GPU available:",
    "TPU available:",
    "Loading `train_dataloader` to estimate number of stepping batches",
    "LeafSpec",
    "The anonymous setting has no effect",
    "wandb: Run history:",  # WandB's closing history and summary block
    "wandb: Run summary:",
    "Be aware that when using `ckpt_path`",
    "setup plugin alembic",
)
"""Other libraries' lines a default run does not print (vramkit/core/run/library_chatter.py)."""


@pytest.mark.slow
def test_smoke_run_prints_no_chatter_and_logs_documented_metrics(
    compose_config, tmp_path, shared_data_dir
):
    # A real `python train.py debug=smoke` as a user runs it: WandB may speak (no WANDB_SILENT).
    env = {key: value for key, value in os.environ.items() if key != "WANDB_SILENT"}
    result = subprocess.run(
        [
            sys.executable,
            str(REPO_ROOT / "train.py"),
            *TINY,
            f"paths.log_dir={tmp_path / 'logs'}",
            f"paths.data_dir={shared_data_dir}",
        ],
        cwd=tmp_path,
        env={**env, "PROJECT_ROOT": str(REPO_ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-3000:]
    lines = result.stdout.splitlines()
    chatter = [line for line in lines if any(known in line for known in CHATTER)]
    assert not chatter, "\n".join(chatter)
    assert "hardware profile cpu" in result.stdout and "best val/hmean" in result.stdout

    (run_dir,) = (tmp_path / "logs" / "text_detection" / "runs").iterdir()
    names = _metric_names(run_dir)
    assert {"train/loss", "val/hmean", "val/precision", "val/recall"} <= names
    phase_metrics = {name for name in names if name.startswith(("train/", "val/", "test/"))}
    assert phase_metrics == TextDetectionModule.logged_metrics(), "monitors are checked against it"
    hmean = json.loads((run_dir / "job_result.json").read_text())["metric"]
    assert 0.0 <= hmean <= 1.0
    assert list((run_dir / "wandb").glob("offline-run-*")), "WandB must run offline by default"
    last = run_dir / "checkpoints" / "last.ckpt"
    assert last.is_file()
    # every run leaves its report, the task's pictures included
    report = (run_dir / "report.html").read_text()
    assert "report/loss.png" in report and "report/task_detections.png" in report

    eval_cfg = compose_config(
        *TINY, f"ckpt_path={last}", f"predictions_dir={run_dir / 'predictions'}", config_name="eval"
    )
    metrics = evaluate(eval_cfg)
    assert json.loads((Path(eval_cfg.paths.output_dir) / SCORES_NAME).read_text()) == metrics
    submissions = sorted((run_dir / "predictions").glob("res_*.txt"))
    assert len(submissions) == eval_cfg.data.synthetic.num_val
    # the submission files, scored by the standalone evaluator, give the validation metrics
    synthetic = SyntheticTextConfig.from_config(
        eval_cfg.data.synthetic, key_prefix="data.synthetic."
    )
    val_gt = synthetic_dataset_dir(Path(eval_cfg.data.data_root), synthetic) / "val" / "gt"
    assert evaluate_folders(val_gt, run_dir / "predictions")["hmean"] == pytest.approx(
        metrics["val/hmean"]
    )


@pytest.mark.slow
def test_a_run_resumes_from_its_last_checkpoint(compose_config):
    first = compose_config(*TINY, "logger=csv")
    train(first)
    last = Path(first.paths.output_dir) / "checkpoints" / "last.ckpt"
    resumed = compose_config(
        *TINY,
        "logger=csv",
        "trainer.max_epochs=2",
        f"ckpt_path={last}",
        f"paths.output_dir={Path(first.paths.output_dir).parent / 'resumed'}",
    )
    before = torch.load(last, weights_only=True)
    train(resumed)
    after = torch.load(
        Path(resumed.paths.output_dir) / "checkpoints" / "last.ckpt", weights_only=True
    )
    # the second epoch ran once, on top of the first: no epoch lost, none repeated
    assert (before["epoch"], after["epoch"]) == (0, 1)
    assert after["global_step"] == 2 * before["global_step"] > 0
