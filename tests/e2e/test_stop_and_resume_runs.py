"""Stopping is a state: ``python train.py`` ended by SIGTERM before its first epoch ends exits
non-zero with a resumable checkpoint; a run that max_time stopped resumes and trains on at a real
learning rate, in its own run folder."""

from __future__ import annotations

import csv
import signal
from pathlib import Path

import pytest
import torch

from tests.e2e.script_runs import run_script
from vramkit.core.run.train import train

TINY = ("+hw=cpu", "debug=smoke", "logger=csv", "callbacks.progress_bar.refresh_rate=0")


@pytest.mark.slow
def test_sigterm_before_the_first_epoch_ends_saves_and_exits_143(tmp_path, shared_data_dir):
    result = run_script(
        "train.py",
        *TINY,
        "trainer.max_epochs=3",
        "data.num_workers=0",  # (loader workers are drilled in test_exact_resume.py)
        "callbacks.last_checkpoint.every_n_train_steps=null",  # only the stop writes one
        "+callbacks.drill._target_=drill_callbacks.SignalSelf",
        f"+callbacks.drill.signum={int(signal.SIGTERM)}",
        "+callbacks.drill.step=2",  # of 4 in the first epoch
        f"paths.log_dir={tmp_path}",
        f"paths.data_dir={shared_data_dir}",
        cwd=tmp_path,
    )
    assert result.returncode == 128 + signal.SIGTERM, result.stderr[-3000:]
    assert "SIGTERM: stopped at step 2" in result.stdout + result.stderr
    (run_dir,) = (tmp_path / "text_detection" / "runs").iterdir()
    saved = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    assert (saved["epoch"], saved["global_step"]) == (0, 2)


def _learning_rates(run_dir: Path) -> dict[int, float]:
    rates = {}
    for metrics in sorted(run_dir.glob("csv/version_*/metrics.csv")):
        with metrics.open() as handle:
            for row in csv.DictReader(handle):
                column = next((k for k in row if k.startswith("lr-") and row[k]), None)
                if column is not None:
                    rates[int(row["step"])] = float(row[column])
    return rates


@pytest.mark.slow
def test_a_run_max_time_stopped_resumes_and_trains_at_a_real_rate(compose_config):
    overrides = (
        *TINY,
        "trainer.max_epochs=200",
        "trainer.max_time=00:00:00:06",
        "model.lr_schedule.warmup_steps=2",  # the few steps of 6 s are past the warm-up
        "callbacks.max_time_annealing.min_steps=4",
        "callbacks.max_time_annealing.check_every_n_steps=2",
        "callbacks.max_time_annealing.safety_fraction=0.0",
        "callbacks.last_checkpoint.every_n_train_steps=null",
    )
    first = compose_config(*overrides)
    train(first)
    run_dir = Path(first.paths.output_dir)
    last = run_dir / "checkpoints" / "last.ckpt"
    stopped = torch.load(last, weights_only=True)
    stop_step = stopped["global_step"]
    assert 0 < stop_step < 200 * 4, "max_time must stop the run"
    peak = first.model.optimizer.lr
    stop_rate = stopped["optimizer_states"][0]["param_groups"][0]["lr"]
    assert stop_rate < 0.3 * peak, f"max_time annealing left {stop_rate} of {peak}"

    train(compose_config(*overrides, f"ckpt_path={last}"))  # the same folder, as a user resumes
    resumed = torch.load(last, weights_only=True)
    assert resumed["global_step"] > stop_step + 3, "the resumed run trained on, in its own time"
    rates = _learning_rates(run_dir)
    after = [rates[step] for step in sorted(rates) if stop_step + 1 < step <= stop_step + 3]
    assert after and min(after) > max(2 * stop_rate, 0.05 * peak), (
        f"resumed at rates {after} after stopping at {stop_rate} (peak {peak})"
    )
    assert (run_dir / "resolved_config.resume_1.yaml").is_file()
