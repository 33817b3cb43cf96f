"""A job of ``hydra/launcher=local_processes`` (submitit's LocalExecutor, the stand-in of
``hydra/launcher=slurm``) gets submitit's preemption signal mid-epoch, saves ``last.ckpt`` at
the next step, is requeued by submitit, resumes from that checkpoint in the same run folder and
ends with bitwise the weights and optimizer state of a job of the same sweep never preempted.

The drill sends the job SIGUSR2 from inside, at the end of step 3 of 8: the signal submitit's
local controller forwards to its tasks ``signal_delay_s`` before the time limit
(``submitit/local/local.py``, ``Controller.wait``), and SLURM sends for ``--signal=USR2@<s>``.
Everything after the signal is submitit's and vramkit's real code: submitit's handler, the
launcher's ``checkpoint`` resubmission, the controller's requeue on exit status 144 and a new
process for the second attempt. Not covered here: ``scontrol requeue`` on a real SLURM cluster and
SLURM's own requeue of a preempted job (no cluster on this machine).
"""

from __future__ import annotations

import csv
import json
import signal

import pytest
import torch
import yaml
from tiny_runs import flat_tensors

from tests.e2e.script_runs import REPO, run_script, script_env

PREEMPT_AT_STEP = 3  # of 2 epochs x 4 batches (debug=smoke), inside the first epoch
NEVER = 1000  # a step the run never reaches: the control job is not preempted


@pytest.mark.slow
def test_a_preempted_submitit_job_requeues_and_resumes_to_the_same_weights(
    tmp_path, shared_data_dir
):
    env = script_env(OMP_NUM_THREADS="1")  # both jobs run at once on a small machine
    env.pop("SUBMITIT_PREEMPT_SIGNAL", None)
    overrides = [
        "-m",
        "hydra/launcher=local_processes",
        "+hw=cpu",
        "debug=smoke",
        "logger=csv",
        "trainer.max_epochs=2",
        "trainer.max_time=null",  # a wall-clock limit would make the two jobs differ
        "data.num_workers=0",
        "callbacks.last_checkpoint.every_n_train_steps=null",  # only the stop writes mid-epoch
        "callbacks.progress_bar.refresh_rate=0",
        "+callbacks.drill._target_=drill_callbacks.SignalAtStep",
        f"+callbacks.drill.signum={int(signal.SIGUSR2)}",
        f"+callbacks.drill.step={PREEMPT_AT_STEP},{NEVER}",  # job 0 preempted, job 1 not
        f"paths.log_dir={tmp_path}",
        f"paths.data_dir={shared_data_dir}",
    ]
    completed = run_script("train.py", *overrides, cwd=REPO, timeout_s=240, env=env)
    assert completed.returncode == 0, completed.stderr[-3000:]
    (sweep,) = (tmp_path / "text_detection" / "multiruns").iterdir()
    preempted, control = sweep / "0", sweep / "1"

    job_logs = "".join(p.read_text() for p in sweep.glob(".submitit/*/*_log.*"))
    assert "Caught signal SIGUSR2" in job_logs and "Requeued job" in job_logs, job_logs[-3000:]
    assert f"SIGUSR2: stopped at step {PREEMPT_AT_STEP}" in job_logs

    # The second attempt wrote into the first one's folder, resuming the stop's checkpoint.
    last = preempted / "checkpoints" / "last.ckpt"
    first = yaml.safe_load((preempted / "resolved_config.yaml").read_text())
    second = yaml.safe_load((preempted / "resolved_config.resume_1.yaml").read_text())
    assert first["ckpt_path"] is None and second["ckpt_path"] == str(last)
    assert not (control / "resolved_config.resume_1.yaml").exists(), "the control job requeued"
    assert sorted(p.name for p in sweep.iterdir() if not p.name.startswith(".")) == [
        "0",
        "1",
        "multirun.yaml",
        "multirun_summary.json",
    ]
    summary = json.loads((sweep / "multirun_summary.json").read_text())
    assert [job["status"] for job in summary["jobs"]] == ["completed", "completed"]
    # The second attempt trained exactly the steps after the stop (0-based: 3 to 7, once each).
    second_log = sorted(preempted.glob("csv/version_*/metrics.csv"))[-1]
    with second_log.open() as handle:
        trained = [int(row["step"]) for row in csv.DictReader(handle) if row.get("train/loss")]
    assert trained == list(range(PREEMPT_AT_STEP, 8)), trained

    ours = torch.load(last, weights_only=True)
    theirs = torch.load(control / "checkpoints" / "last.ckpt", weights_only=True)
    assert ours["global_step"] == theirs["global_step"] == 8, "both jobs ran to the end"
    assert ours["epoch"] == theirs["epoch"]
    for part in ("state_dict", "optimizer_states"):
        expected = flat_tensors(theirs[part] if part == "state_dict" else theirs[part][0]["state"])
        actual = flat_tensors(ours[part] if part == "state_dict" else ours[part][0]["state"])
        assert expected.keys() == actual.keys()
        differing = [name for name, t in expected.items() if not torch.equal(t, actual[name])]
        assert not differing, f"{part} differs after the requeue in {differing[:5]}"
