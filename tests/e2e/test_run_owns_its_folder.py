"""``python train.py seed=7 hydra.run.dir=<another run's folder>`` is refused in one line, exit 2,
with not one byte of that folder changed; so is a single run in a running sweep's job folder; a
sweep's job holds its folder locked while it runs."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
from hydra.types import RunMode

from tests.e2e.entry_points import run_entry_point
from tests.e2e.script_runs import run_script
from vramkit.core.run import run_folder_guard
from vramkit.core.run.folder.run_folder_claim import release_claim
from vramkit.core.run.folder.run_folder_lock import LOCK_NAME, RunFolderBusyError, lock_run_folder
from vramkit.core.run.run_folder_guard import claim_job_folder


def _tree(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def _one_line(code: int, err: str) -> str:
    assert code == 2, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    return err.strip()


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory, shared_data_dir) -> Path:
    """The folder of a real ``debug=smoke`` run that ended."""
    logs = tmp_path_factory.mktemp("logs")
    result = run_script(
        "train.py",
        "+hw=cpu",
        "debug=smoke",
        "logger=csv",
        "callbacks.progress_bar.refresh_rate=0",
        f"paths.log_dir={logs}",
        f"paths.data_dir={shared_data_dir}",
        cwd=logs,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (run,) = (logs / "text_detection" / "runs").iterdir()
    return run


@pytest.mark.slow
def test_a_new_run_in_a_finished_or_killed_runs_folder_changes_nothing(
    monkeypatch, capsys, tmp_path, finished_run, shared_data_dir
):
    killed = tmp_path / "killed"
    shutil.copytree(finished_run, killed)
    (killed / LOCK_NAME).write_text('{"pid": 999999999, "host": "elsewhere"}\n')  # left behind
    for run in (finished_run, killed):
        before = _tree(run)
        code, err = run_entry_point(
            monkeypatch,
            capsys,
            "train.py",
            "+hw=cpu",
            "debug=smoke",
            "seed=7",
            f"paths.data_dir={shared_data_dir}",
            f"hydra.run.dir={run}",
        )
        line = _one_line(code, err)
        assert line.startswith(f"error: hydra.run.dir: {run} holds run {run.name}'s checkpoints")
        assert f"resume it with ckpt_path={run / 'checkpoints' / 'last.ckpt'}" in line
        assert _tree(run) == before, "not one byte of the other run's folder changed"


@pytest.mark.slow
def test_a_single_run_in_a_running_sweeps_job_folder_is_refused(monkeypatch, capsys, tmp_path):
    sweep = tmp_path / "multiruns" / "2026-11-28_10-00-00"
    (sweep / "0").mkdir(parents=True)
    sweep_lock, job_lock = lock_run_folder(sweep), lock_run_folder(sweep / "0")  # job 0 runs
    try:
        for folder, says in (
            (sweep / "0", "is in use by another run"),
            (sweep / "1", "job folder"),
        ):
            code, err = run_entry_point(
                monkeypatch, capsys, "train.py", "+hw=cpu", "debug=smoke", f"hydra.run.dir={folder}"
            )
            assert says in _one_line(code, err)
        assert sorted(p.name for p in sweep.iterdir()) == [LOCK_NAME, "0"], "no job folder 1"
        assert sorted(p.name for p in (sweep / "0").iterdir()) == [LOCK_NAME]
    finally:
        job_lock.release()
        sweep_lock.release()


class _SweepJob:
    """Hydra's view from inside a multirun job whose folder is ``output_dir``."""

    def __init__(self, output_dir: Path) -> None:
        self.mode, self.runtime = RunMode.MULTIRUN, SimpleNamespace(output_dir=str(output_dir))

    def initialized(self) -> bool:
        return True

    def get(self) -> _SweepJob:
        return self


def test_a_sweeps_job_locks_its_folder_until_the_job_ends(tmp_path, monkeypatch):
    job = tmp_path / "sweep" / "3"
    monkeypatch.setattr(run_folder_guard, "HydraConfig", _SweepJob(job))
    try:
        claim_job_folder({})
        with pytest.raises(RunFolderBusyError, match=r"in use by another run"):
            lock_run_folder(job)  # the single run started there
        release_claim(job)
        lock_run_folder(job).release()  # the job ended: its folder is free again
        claim_job_folder({"LOCAL_RANK": "1"})  # a DDP process of the job claims nothing
        assert not (job / LOCK_NAME).exists()
    finally:
        release_claim()
