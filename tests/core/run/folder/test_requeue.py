"""A requeued submitit job finds its run's last.ckpt; a first attempt or a plain run does not."""

from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf

from vramkit.core.run.folder.requeue import requeued_checkpoint

SUBMITIT_JOB = {"SUBMITIT_EXECUTOR": "slurm"}


def _cfg(run: Path, ckpt_path: str | None = None):
    return OmegaConf.create(
        {
            "ckpt_path": ckpt_path,
            "callbacks": {
                "last_checkpoint": {"dirpath": str(run / "checkpoints"), "filename": "last"}
            },
        }
    )


def test_a_requeued_job_resumes_from_its_run_folders_last_checkpoint(tmp_path):
    assert requeued_checkpoint(_cfg(tmp_path), SUBMITIT_JOB) is None, "first attempt: no file"
    last = tmp_path / "checkpoints" / "last.ckpt"
    last.parent.mkdir()
    last.write_bytes(b"")
    assert requeued_checkpoint(_cfg(tmp_path), SUBMITIT_JOB) == last


def test_only_a_submitit_job_without_a_given_checkpoint_resumes_by_itself(tmp_path):
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "last.ckpt").write_bytes(b"")
    assert requeued_checkpoint(_cfg(tmp_path), {}) is None, "a plain run resumes when asked"
    given = str(tmp_path / "other.ckpt")
    assert requeued_checkpoint(_cfg(tmp_path, given), SUBMITIT_JOB) is None, "the user's wins"
    without = OmegaConf.create({"ckpt_path": None, "callbacks": {"last_checkpoint": None}})
    assert requeued_checkpoint(without, SUBMITIT_JOB) is None
