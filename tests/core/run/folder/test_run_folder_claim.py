"""A refusal before any work leaves no run folder, and a resumed run's folder as it was."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

from vramkit.core.run.folder.run_folder import create_run_folder, free_run_folder
from vramkit.core.run.folder.run_folder_claim import claim_run_folder, withdraw_claim

NOON = 1_700_000_000.0


def new_run_folder(runs: Path, now: float, environ: dict[str, str]) -> Path:
    """A new run's folder as the run makes it: named by the resolver, created by the guard."""
    return create_run_folder(free_run_folder(runs, now, environ))


def _hydra_writes(folder: Path, subdir: str = ".hydra") -> None:
    """What Hydra and train() write before any work: records, config, log lines."""
    (folder / subdir).mkdir()
    (folder / subdir / "config.yaml").write_text("seed: 1\n")
    with (folder / "train.log").open("a") as log:
        log.write("[INFO] hw: detected ...\n")
    (folder / "resolved_config.yaml").write_text("seed: 1\n")


def _tree(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def test_a_refused_new_run_leaves_no_folder_and_no_runs_folder_it_made(tmp_path):
    logs = tmp_path / "logs"
    folder = new_run_folder(logs / "text_detection" / "runs", NOON, {})
    claim_run_folder(folder)
    _hydra_writes(folder)
    assert withdraw_claim()
    assert not logs.exists(), "logs/text_detection/runs was made for this run only"
    assert not withdraw_claim(), "withdrawn once"


def test_a_refusal_keeps_other_runs_beside_it(tmp_path):
    runs = tmp_path / "runs"
    other = new_run_folder(runs, NOON, {})
    folder = new_run_folder(runs, NOON, {})
    claim_run_folder(folder)
    _hydra_writes(folder)
    assert withdraw_claim()
    assert not folder.exists() and other.is_dir()


def test_a_refused_resume_leaves_its_runs_folder_byte_identical(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    _hydra_writes(run)
    (run / "checkpoints").mkdir()
    (run / "checkpoints" / "last.ckpt").write_bytes(b"weights")
    before = _tree(run)
    claim_run_folder(run)
    (run / ".hydra.resume_1").mkdir()  # the resume's own records
    (run / "resolved_config.resume_1.yaml").write_text("seed: 1\n")
    with (run / "train.log").open("a") as log:
        log.write("[INFO] resuming ...\n")
    assert withdraw_claim()
    assert _tree(run) == before
    assert sorted(p.name for p in run.iterdir()) == sorted(
        [".hydra", "checkpoints", "resolved_config.yaml", "train.log"]
    )


def test_a_run_that_did_work_keeps_its_folder(tmp_path):
    folder = new_run_folder(tmp_path / "runs", NOON, {})
    claim_run_folder(folder)
    _hydra_writes(folder)
    (folder / "checkpoints").mkdir()  # a late refusal (a full disk): what was written is evidence
    assert not withdraw_claim()
    assert (folder / "checkpoints").is_dir() and (folder / "train.log").is_file()


def test_a_literal_run_dir_that_did_not_exist_is_removed_with_its_parents(tmp_path):
    folder = tmp_path / "a" / "b" / "run"
    claim_run_folder(folder)
    _hydra_writes(folder)
    assert withdraw_claim()
    assert list(tmp_path.iterdir()) == []


def test_a_folder_removed_under_the_run_does_not_hide_the_refusal(tmp_path, caplog):
    folder = new_run_folder(tmp_path / "runs", NOON, {})
    claim_run_folder(folder)
    shutil.rmtree(folder)  # e.g. the user cleaned up while the run started
    assert not withdraw_claim()
    assert "could not remove what this run wrote" in caplog.text
