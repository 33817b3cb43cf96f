"""``python train.py`` with a mistake: one message, exit status 2, no traceback, no folder.

Each case runs train.py's entry point in this process (``sys.argv`` set, as Hydra reads it), so a
refusal costs a composition, not an interpreter start; the refusals exit before any training.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.e2e.entry_points import run_entry_point
from vramkit.core.run.folder.run_folder_lock import LOCK_NAME, lock_run_folder


def _train_py(monkeypatch, capsys, *args: str) -> tuple[int, str]:
    """Run ``python train.py <args>`` here; its exit status and stderr."""
    return run_entry_point(monkeypatch, capsys, "train.py", *args)


def _read_only_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "read_only"
    folder.mkdir()
    folder.chmod(0o555)
    if os.access(folder, os.W_OK):  # root writes anyway; /sys refuses new folders to anyone
        return Path("/sys/vramkit_logs")
    return folder


@pytest.mark.parametrize(
    ("mistake", "says"),
    [
        ("+hw.batch_size=0", "hw.batch_size: must be a positive int"),  # found by the profile
        ("trainer.precision=64", "trainer.precision: expected str, got 64"),  # before the profile
        ("data.num_workers=-1", "data.num_workers: must be ≥ 0, got -1"),  # by the datamodule
        ("seed=abc", "seed: expected int or null, got 'abc' (str)"),
    ],
)
def test_a_refused_run_leaves_no_run_folder(monkeypatch, capsys, tmp_path, mistake, says):
    logs = tmp_path / "logs"
    code, err = _train_py(monkeypatch, capsys, "debug=smoke", f"paths.log_dir={logs}", mistake)
    assert code == 2, err
    assert says in err and "Traceback" not in err and "HYDRA_FULL_ERROR" not in err
    assert not logs.exists(), "a refusal before any work leaves no folder"


@pytest.mark.parametrize(
    ("script", "mistake", "says"),
    [
        ("eval.py", "verbose=loud", "verbose: "),  # the first check evaluate() makes
        ("eval.py", "ckpt_path=/nonexistent/last.ckpt", "ckpt_path"),  # the resume contract
        ("scripts/export.py", "verbose=loud", "verbose: "),
    ],
)
def test_a_refused_eval_or_export_leaves_no_folder(
    monkeypatch, capsys, tmp_path, script, mistake, says
):
    logs = tmp_path / "logs"
    code, err = run_entry_point(
        monkeypatch, capsys, script, "+hw=cpu", f"paths.log_dir={logs}", mistake
    )
    assert code == 2, err
    assert says in err and "Traceback" not in err, err
    assert not logs.exists(), "a refusal before any work leaves no folder"


def test_a_read_only_log_folder_is_refused_in_one_message(monkeypatch, capsys, tmp_path):
    logs = _read_only_dir(tmp_path)
    code, err = _train_py(monkeypatch, capsys, "+hw=cpu", "debug=smoke", f"paths.log_dir={logs}")
    assert code == 2, err
    assert err.startswith("error: paths.log_dir (conf/paths/default.yaml): cannot create a run")
    assert "Traceback" not in err


def test_a_run_in_a_held_folder_is_refused_naming_the_holder(monkeypatch, capsys, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "train.log").write_text("the first run's lines\n")
    held = lock_run_folder(run)  # the first run, still going
    try:
        code, err = _train_py(monkeypatch, capsys, "+hw=cpu", "debug=smoke", f"hydra.run.dir={run}")
    finally:
        held.release()
    assert code == 2, err
    assert f"is in use by another run (pid {os.getpid()} on host" in err
    assert sorted(p.name for p in run.iterdir()) == ["train.log"], "nothing written beside it"
    assert (run / "train.log").read_text() == "the first run's lines\n"
    assert not (run / LOCK_NAME).exists()


@pytest.mark.parametrize(
    "sweep",
    [
        ("-m", "+hw=t4", "model.optimizer.lr=0.001,0.002"),
        ("hparams_search=dbnet_optuna", "+hw=t4", "hydra.sweeper.n_trials=2"),  # the docs' line
        ("-m", "+hw=cpu", "trainer.max_epochs=1,2", "trainer.precision=32-true,64"),  # job 3's
        ("-m", "+hw=cpu", "trainer.max_epochs=1,2", "ckpt_path=/nonexistent/last.ckpt"),
    ],
)
def test_a_sweep_mistake_is_refused_once_before_any_job(monkeypatch, capsys, tmp_path, sweep):
    logs = tmp_path / "logs"
    code, err = _train_py(monkeypatch, capsys, *sweep, "debug=smoke", f"paths.log_dir={logs}")
    assert code == 2, err
    assert err.count("error: ") == 1 and "Traceback" not in err, err
    assert not logs.exists(), "no sweep folder, no job folder"


def test_a_sweep_into_a_held_sweep_folder_is_refused_before_any_job(monkeypatch, capsys, tmp_path):
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    held = lock_run_folder(sweep)  # another sweep, still going
    try:
        code, err = _train_py(
            monkeypatch,
            capsys,
            *("-m", "+hw=cpu", "debug=smoke", "trainer.max_epochs=1,2"),
            f"hydra.sweep.dir={sweep}",
        )
    finally:
        held.release()
    assert code == 2, err
    assert f"run folder {sweep} is in use by another run (pid {os.getpid()}" in err
    assert list(sweep.iterdir()) == [], "no job folder, no multirun.yaml"


@pytest.mark.parametrize(
    ("script", "mistake", "fix"),
    [
        ("train.py", "trainer.max_epoch=3", "did you mean trainer.max_epochs=3?"),
        ("train.py", "hw.memory_gib=0.63", "with a plus: +hw.memory_gib=0.63"),
        ("eval.py", "trainer.max_epoch=3", "did you mean trainer.max_epochs=3?"),
        ("scripts/export.py", "export.opst=17", "did you mean export.opset=17?"),
    ],
)
def test_a_key_hydra_refuses_is_one_line_with_the_fix(
    monkeypatch, capsys, tmp_path, script, mistake, fix
):
    logs = tmp_path / "logs"
    code, err = run_entry_point(monkeypatch, capsys, script, f"paths.log_dir={logs}", mistake)
    assert code == 2, err
    assert err.count("\n") == 1 and err.startswith(f"error: {mistake}: ") and fix in err, err
    assert not logs.exists()
