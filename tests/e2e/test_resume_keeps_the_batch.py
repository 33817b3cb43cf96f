"""A resume on a machine that fits a smaller batch trains what the uninterrupted run trains: the
same samples in every optimizer step and the same number of steps (the issue's drill: resumed with
less memory the batch went 4 -> 1 mid-epoch with no word, and the run ended at step 64 of 16)."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
import torch

from tests.e2e.script_runs import run_script

TINY = (
    "+hw=cpu",
    "debug=smoke",
    "logger=csv",
    "callbacks.progress_bar.refresh_rate=0",
    "callbacks.last_checkpoint.every_n_train_steps=null",  # only the stop writes one
    "+callbacks.drill._target_=drill_callbacks.SamplesPerStep",
)


def _train(*overrides: str, log_dir: Path, data_dir: Path, steps: Path):
    return run_script(
        "train.py",
        *TINY,
        f"+callbacks.drill.path={steps}",
        *overrides,
        f"paths.log_dir={log_dir}",
        f"paths.data_dir={data_dir}",
        cwd=log_dir,
    )


def _steps(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.slow
def test_a_resume_that_fits_a_smaller_batch_trains_the_same_samples_per_step(
    tmp_path, shared_data_dir
):
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    whole.mkdir()
    cut.mkdir()
    data = {"data_dir": shared_data_dir}
    uninterrupted = _train(log_dir=whole, steps=whole / "steps.jsonl", **data)
    assert uninterrupted.returncode == 0, uninterrupted.stderr[-3000:]

    stopped = _train(
        "+callbacks.stop._target_=drill_callbacks.SignalAtStep",
        f"+callbacks.stop.signum={int(signal.SIGTERM)}",
        "+callbacks.stop.step=2",  # of 4: mid-epoch
        log_dir=cut,
        steps=cut / "steps.jsonl",
        **data,
    )
    assert stopped.returncode == 128 + signal.SIGTERM, stopped.stderr[-3000:]
    (run,) = (cut / "text_detection" / "runs").iterdir()
    last = run / "checkpoints" / "last.ckpt"
    # This machine now fits 1 sample per batch (hw.batch_size=1 stands for less memory: the
    # settled per-device batch is what changes either way).
    resumed = _train(
        f"ckpt_path={last}", "hw.batch_size=1", log_dir=cut, steps=cut / "steps.jsonl", **data
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resume: batch 1 × 4 accumulated (this machine settled 1 × 1) keeps the " in (
        resumed.stderr + resumed.stdout
    )

    (whole_run,) = (whole / "text_detection" / "runs").iterdir()
    ends = [
        torch.load(folder / "checkpoints" / "last.ckpt", weights_only=True)
        for folder in (whole_run, run)
    ]
    assert [end["global_step"] for end in ends] == [4, 4]
    assert ends[1]["vramkit_resume_contract"]["batch"]["accumulate"] == 4
    assert _steps(cut / "steps.jsonl") == _steps(whole / "steps.jsonl")
    assert sum(len(step["samples"]) for step in _steps(cut / "steps.jsonl")) == 16
