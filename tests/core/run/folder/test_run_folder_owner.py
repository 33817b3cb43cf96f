"""A run owns its folder: a new run is refused where another run's checkpoints or records are,
or in a running sweep's job folder, and the check changes nothing in the folder."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from vramkit.core.config.schema import ConfigError
from vramkit.core.run.folder.run_folder_claim import claim_run_folder, release_claim
from vramkit.core.run.folder.run_folder_lock import LOCK_NAME, RunFolderBusyError, lock_run_folder
from vramkit.core.run.folder.run_folder_owner import check_folder_owner, run_records


def _finished_run(folder: Path, *, checkpoints: bool = True, stale_lock: bool = True) -> Path:
    """What a finished (or killed) training run leaves behind."""
    (folder / ".hydra").mkdir(parents=True)
    (folder / ".hydra" / "config.yaml").write_text("seed: 1\n")
    (folder / "train.log").write_text("[INFO] trained\n")
    (folder / "resolved_config.yaml").write_text("seed: 1\n")
    (folder / "overrides.txt").write_text("seed=1\n")
    if checkpoints:
        (folder / "checkpoints").mkdir()
        (folder / "checkpoints" / "epoch_000.ckpt").write_bytes(b"best")
        os.utime(folder / "checkpoints" / "epoch_000.ckpt", (1e9, 1e9))  # the older one
        (folder / "checkpoints" / "last.ckpt").write_bytes(b"last")
    if stale_lock:  # a killed run's: the file stays, its lock went with the process
        (folder / LOCK_NAME).write_text('{"pid": 999999999, "host": "elsewhere"}\n')
    return folder


def _tree(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def test_a_new_run_in_a_finished_runs_folder_is_refused_changing_nothing(tmp_path):
    run = _finished_run(tmp_path / "2026-11-28_10-00-00")
    before = _tree(run)
    with pytest.raises(ConfigError) as refused:
        check_folder_owner(run, None, {})
    message = str(refused.value)
    assert message == (
        f"hydra.run.dir: {run} holds run 2026-11-28_10-00-00's checkpoints (last.ckpt, "
        f"epoch_000.ckpt); a new run there would overwrite them: resume it with "
        f"ckpt_path={run / 'checkpoints' / 'last.ckpt'}, or choose another folder (leave "
        "hydra.run.dir unset for a folder of its own)"
    )
    assert "\n" not in message and refused.value.keys == ("hydra.run.dir",)
    assert _tree(run) == before


def test_a_run_killed_before_its_first_checkpoint_is_named_by_its_records(tmp_path):
    run = _finished_run(tmp_path / "run", checkpoints=False)
    with pytest.raises(
        ConfigError,
        match=r"holds run run.s records and no checkpoint \(\.hydra, overrides\.txt and 2 more\); "
        r".*: choose another folder",
    ):
        check_folder_owner(run, None, {})


def test_a_checkpoint_from_elsewhere_does_not_make_it_a_resume(tmp_path):
    run = _finished_run(tmp_path / "run")
    other = tmp_path / "other" / "last.ckpt"
    with pytest.raises(ConfigError, match=r"resume it with ckpt_path=.*run/checkpoints/last"):
        check_folder_owner(run, str(other), {})


def test_a_tool_is_not_told_to_resume_and_its_checkpoint_makes_no_resume(tmp_path):
    run = _finished_run(tmp_path / "run")
    with pytest.raises(ConfigError) as refused:
        check_folder_owner(run, str(run / "checkpoints" / "last.ckpt"), {}, trains=False)
    assert "holds run run's checkpoints and records (.hydra, checkpoints and 3 more)" in str(
        refused.value
    )
    assert "resume it" not in str(refused.value)


def test_a_resume_of_the_folders_own_run_and_a_requeued_slurm_job_may_write(tmp_path):
    run = _finished_run(tmp_path / "run")
    check_folder_owner(run, str(run / "checkpoints" / "last.ckpt"), {})
    requeued = _finished_run(tmp_path / "slurm-77")
    check_folder_owner(requeued, None, {"SLURM_JOB_ID": "77", "SLURM_RESTART_COUNT": "1"})
    with pytest.raises(ConfigError):  # its first attempt finds another job's folder
        check_folder_owner(requeued, None, {"SLURM_JOB_ID": "77", "SLURM_RESTART_COUNT": "0"})


def test_an_unused_folder_is_free(tmp_path):
    check_folder_owner(tmp_path / "missing", None, {})
    (tmp_path / "empty").mkdir()
    check_folder_owner(tmp_path / "empty", None, {})
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "README.md").write_text("my notes\n")
    (notes / LOCK_NAME).write_text("")  # a stale lock alone: its run wrote nothing else
    check_folder_owner(notes, None, {})
    assert run_records(notes) == []


def test_a_live_holder_is_named_and_the_check_creates_no_lock_file(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    check_folder_owner(run, None, {})
    assert not (run / LOCK_NAME).exists(), "checking is not locking"
    held = lock_run_folder(run)
    try:
        with pytest.raises(RunFolderBusyError, match=r"is in use by another run \(pid \d+"):
            check_folder_owner(run, str(run / "checkpoints" / "last.ckpt"), {})
    finally:
        held.release()


def test_a_job_folder_of_a_running_sweep_is_refused_even_before_its_job_starts(tmp_path):
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    held = lock_run_folder(sweep)
    try:
        with pytest.raises(ConfigError, match=r"is a job folder of the sweep running in .*sweep"):
            check_folder_owner(sweep / "1", None, {})
    finally:
        held.release()
    check_folder_owner(sweep / "1", None, {})  # the sweep ended: an empty folder is free


def test_a_jobs_claim_ends_with_the_job_and_the_sweeps_with_the_sweep(tmp_path):
    sweep, job = tmp_path / "sweep", tmp_path / "sweep" / "0"
    claim_run_folder(sweep)
    claim_run_folder(job)
    try:
        release_claim(job)
        assert not (job / LOCK_NAME).exists() and (sweep / LOCK_NAME).exists()
        with pytest.raises(RunFolderBusyError):
            lock_run_folder(sweep)
    finally:
        release_claim()
    assert not (sweep / LOCK_NAME).exists()
