"""Sweeps that search (Optuna) and end with their best job; a sweep through the submitit launcher
is tests/e2e/test_preempted_job_requeues.py's."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hydra.core.utils import JobReturn, JobStatus
from omegaconf import OmegaConf

from vramkit.core.run.records.multirun_summary import SUMMARY, job_result, summarize
from vramkit.core.run.settling.resolvers import optuna_direction

REPO = Path(__file__).resolve().parents[4]


def _job(value, status=JobStatus.COMPLETED, overrides=("model.optimizer.lr=0.1",)):
    job = JobReturn(overrides=list(overrides), status=status)
    job._return_value = value
    return job


def test_a_failed_job_is_listed_with_its_error_and_the_best_is_picked_by_mode():
    records = [
        job_result(_job(0.4), "sweep/0"),
        job_result(_job(RuntimeError("diverged"), JobStatus.FAILED), "sweep/1"),
        job_result(_job(0.7), "sweep/2"),
        job_result(_job(float("nan")), "sweep/3"),
    ]
    assert records[1]["status"] == "failed" and records[1]["error"] == "RuntimeError: diverged"
    assert records[3]["metric"] is None  # a NaN metric ranks nowhere
    best_max = summarize(records, "max")
    assert best_max["best"]["folder"] == "sweep/2" and best_max["failed"] == 1
    assert summarize(records, "min")["best"]["folder"] == "sweep/0"
    assert len(best_max["jobs"]) == 4


def test_the_study_direction_follows_monitor_mode():
    assert optuna_direction("max") == "maximize"
    assert optuna_direction("min") == "minimize"
    with pytest.raises(ValueError, match="max or min"):
        optuna_direction("maximum")


def _sweep(tmp_path: Path, data_dir: Path, *overrides: str) -> tuple[dict, str]:
    """The summary of a debug=smoke sweep run as `python train.py`, and its output."""
    flags = [o for o in overrides if o.startswith("-")]  # Hydra's flags come before overrides
    values = [o for o in overrides if not o.startswith("-")]
    command = [sys.executable, "train.py", *flags, "+hw=cpu", "debug=smoke"]
    command += [f"paths.log_dir={tmp_path}", f"paths.data_dir={data_dir}", *values]
    completed = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert completed.returncode == 0, completed.stderr[-3000:]
    (summary_path,) = tmp_path.glob(f"text_detection/multiruns/*/{SUMMARY}")
    return json.loads(summary_path.read_text()), completed.stdout + completed.stderr


@pytest.mark.slow
def test_an_optuna_sweep_runs_its_trials_and_names_the_best(tmp_path, shared_data_dir):
    summary, output = _sweep(
        tmp_path, shared_data_dir, "hparams_search=dbnet_optuna", "hydra.sweeper.n_trials=2"
    )
    assert len(summary["jobs"]) == 2 and summary["failed"] == 0
    suggested = [o for o in summary["jobs"][0]["overrides"] if o.startswith("model.optimizer.lr=")]
    assert suggested and 0.0003 <= float(suggested[0].split("=")[1]) <= 0.01
    assert summary["best"] is not None and summary["optimized_metric"] == "val/hmean"
    (results,) = tmp_path.glob("text_detection/multiruns/*/optimization_results.yaml")
    assert "best_params" in results.read_text()
    # each job in its numbered folder, trained with the learning rate the study suggested
    (sweep_dir,) = (tmp_path / "text_detection" / "multiruns").iterdir()
    job_dirs = sorted(d for d in sweep_dir.iterdir() if d.is_dir() and d.name.isdigit())
    assert [d.name for d in job_dirs] == ["0", "1"]
    assert sorted(Path(job["folder"]) for job in summary["jobs"]) == job_dirs
    for job in summary["jobs"]:
        job_dir = Path(job["folder"])
        lr = next(o for o in job["overrides"] if o.startswith("model.optimizer.lr="))
        resolved = OmegaConf.load(job_dir / "resolved_config.yaml")
        assert resolved.model.optimizer.lr == pytest.approx(float(lr.split("=")[1]))
        (metrics_csv,) = job_dir.glob("csv/version_*/metrics.csv")
        assert "val/hmean" in metrics_csv.read_text().splitlines()[0].split(",")
    assert "setup plugin alembic" not in output  # Optuna's import, quiet (conf/hydra/default.yaml)
