"""A wrong checkpoint is refused by ``python train.py`` / ``python eval.py`` in one line, exit 2;
a training run refuses before anything is written: the checkpoint's run folder stays
byte-identical and no new run folder appears."""

from __future__ import annotations

import csv
import hashlib
import subprocess
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from tests.e2e.entry_points import run_entry_point
from tests.e2e.script_runs import REPO, run_script

TINY = ("+hw=cpu", "debug=smoke", "logger=csv")
QUIET = {"train.py": ("callbacks.progress_bar.refresh_rate=0",), "eval.py": ()}


def _run(
    script: str, *overrides: str, log_dir: Path, data_dir: Path
) -> subprocess.CompletedProcess:
    return run_script(
        script,
        *TINY,
        *QUIET[script],
        *overrides,
        f"paths.log_dir={log_dir}",
        f"paths.data_dir={data_dir}",
        cwd=log_dir,
    )


def _refuse(monkeypatch, capsys, script: str, *overrides: str, log_dir: Path, data_dir: Path):
    """Run a refused ``python <script> …`` in this process (a refusal needs no interpreter of
    its own): the completed-process view of its exit status and stderr."""
    monkeypatch.chdir(log_dir)
    monkeypatch.setenv("PROJECT_ROOT", str(REPO))
    args = (*TINY, *QUIET[script], *overrides)
    code, err = run_entry_point(
        monkeypatch, capsys, script, *args, f"paths.log_dir={log_dir}", f"paths.data_dir={data_dir}"
    )
    return subprocess.CompletedProcess(script, code, "", err)


def _tree_hash(folder: Path) -> str:
    """One digest of every file's relative path and bytes under ``folder``."""
    digest = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(folder)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def _refused_in_one_line(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, result.stderr[-3000:]
    return errors[0]


@pytest.mark.slow
def test_wrong_checkpoints_are_refused_before_anything_is_written(
    tmp_path, shared_data_dir, monkeypatch, capsys
):
    paths = {"log_dir": tmp_path, "data_dir": shared_data_dir}
    first = _run("train.py", **paths)
    assert first.returncode == 0, first.stderr[-3000:]
    runs = tmp_path / "text_detection" / "runs"
    (run,) = runs.iterdir()
    last = run / "checkpoints" / "last.ckpt"
    half = tmp_path / "half.ckpt"
    half.write_bytes(last.read_bytes()[: last.stat().st_size // 2])
    before = _tree_hash(run)

    wider = _refused_in_one_line(
        _refuse(monkeypatch, capsys, "train.py", "model=dbnet_r18", f"ckpt_path={last}", **paths)
    )
    assert "parameters differ in shape, first net.backbone.conv1.weight [16,3,7,7]" in wider
    assert wider.endswith("it was trained with task=text_detection, model=dbnet_tiny")

    torn = _refused_in_one_line(
        _refuse(monkeypatch, capsys, "train.py", f"ckpt_path={half}", **paths)
    )
    assert torn == f"error: ckpt_path: {half} is truncated ({half.stat().st_size} bytes of a " + (
        "torch.save archive whose end is missing)"
    )

    changed = _refuse(
        monkeypatch,
        capsys,
        "train.py",
        f"ckpt_path={last}",
        "model.optimizer.lr=0.01",
        "hw.batch_size=2",
        **paths,
    )
    assert changed.returncode == 2, changed.stderr[-3000:]
    assert "  model.optimizer.lr: 0.004 -> 0.01\n" in changed.stderr
    assert f"init_from={last}" in changed.stderr

    # Copied without its run folder, the checkpoint's own contract is checked (the issue's
    # drill: exit 0, nothing said, and the optimizer trained at the checkpoint's rate).
    copied = tmp_path / "elsewhere" / "copied.ckpt"
    copied.parent.mkdir()
    copied.write_bytes(last.read_bytes())
    changed_copy = _refuse(
        monkeypatch,
        capsys,
        "train.py",
        f"ckpt_path={copied}",
        "seed=7",
        "data.image_size=160",
        "model.optimizer.lr=0.5",
        **paths,
    )
    assert changed_copy.returncode == 2, changed_copy.stderr[-3000:]
    for line in (
        "data.image_size: 128 -> 160",
        "model.optimizer.lr: 0.004 -> 0.5",
        "seed: 42 -> 7",
    ):
        assert f"  {line}\n" in changed_copy.stderr
    seeded = _refuse(
        monkeypatch,
        capsys,
        "train.py",
        f"ckpt_path={copied}",
        "seed=7",
        "resume.allow_changes=true",
        **paths,
    )
    assert "cannot apply seed: 42 -> 7 (the random streams" in _refused_in_one_line(seeded)

    evaluated = _refuse(
        monkeypatch, capsys, "eval.py", "model=dbnet_r18", f"ckpt_path={last}", **paths
    )
    assert "parameters differ in shape" in _refused_in_one_line(evaluated)

    assert _tree_hash(run) == before
    assert list(runs.iterdir()) == [run]

    # Allowed, the changes are printed, recorded and applied: the learning rate to the optimizer
    # and its schedule once the checkpoint's optimizer state is loaded (the warm-up goes on from
    # step 4 at 0.01 / 50), and batch 2 regrouped to keep 4 samples per optimizer step.
    allowed = _run(
        "train.py",
        f"ckpt_path={last}",
        "model.optimizer.lr=0.01",
        "hw.batch_size=2",
        "trainer.max_epochs=2",
        "resume.allow_changes=true",
        **paths,
    )
    assert allowed.returncode == 0, allowed.stderr[-3000:]
    assert "resume: applying model.optimizer.lr: 0.004 -> 0.01" in allowed.stderr
    assert "resume: batch 2 × 2 accumulated (this machine settled 2 × 1)" in (
        allowed.stdout + allowed.stderr
    )
    recorded = OmegaConf.load(run / "resolved_config.resume_1.yaml")
    assert recorded.resume.changes == ["model.optimizer.lr: 0.004 -> 0.01"]
    assert (recorded.model.optimizer.lr, recorded.data.batch_size) == (0.01, 2)
    assert recorded.trainer.accumulate_grad_batches == 2
    with (run / "csv" / "version_1" / "metrics.csv").open() as handle:
        rates = {
            int(row["step"]): float(row["lr-AdamW"])
            for row in csv.DictReader(handle)
            if row["lr-AdamW"]
        }
    assert rates[4] == pytest.approx(0.01 * 5 / 50)
    assert torch.load(last, weights_only=True)["global_step"] == 8
