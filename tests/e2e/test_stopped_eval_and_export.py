"""eval.py and scripts/export.py stop like train.py: SIGTERM / SIGINT mid-work ends them with
exit status 143 / 130 (never 0: a scheduler must not record a stopped evaluation as done), one
line naming the command to run again, and no half-written file."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import lightning as L
import pytest
import torch

from tests.e2e.script_runs import run_script, script_command, script_env
from vramkit.core.config.instantiate import instantiate
from vramkit.tasks.text_detection.export.export_checkpoint import STAGING_PREFIX

# 4 validation images one per batch: a signal at batch 1 comes with batches still to run
TINY = ("+hw=cpu", "debug=smoke", "hw.val_batch_size=1", "logger=csv")


def _checkpoint(compose_config, path: Path) -> Path:
    torch.manual_seed(0)
    module = instantiate(compose_config(*TINY, config_name="eval").model)
    torch.save(
        {"state_dict": module.state_dict(), "pytorch-lightning_version": L.__version__}, path
    )
    return path


def _half_written(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if ".tmp-" in p.name or STAGING_PREFIX in p.name]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("signum", "phase"), [(signal.SIGTERM, "predict"), (signal.SIGINT, "validate")]
)
def test_a_signal_mid_evaluation_exits_128_plus_n_without_scores(
    compose_config, tmp_path, shared_data_dir, signum, phase
):
    ckpt = _checkpoint(compose_config, tmp_path / "model.ckpt")
    logs = tmp_path / "logs"
    result = run_script(
        "eval.py",
        *TINY,
        f"ckpt_path={ckpt}",
        "prediction_writer._target_=drill_callbacks.SignalingSubmissionWriter",
        f"+prediction_writer.signum={int(signum)}",
        f"+prediction_writer.phase={phase}",
        "+prediction_writer.batch=1",
        f"paths.log_dir={logs}",
        f"paths.data_dir={shared_data_dir}",
        cwd=tmp_path,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 128 + signum, output[-3000:]
    assert f"{signum.name}: the evaluation stopped before it finished" in output
    assert "run it again: python eval.py +hw=cpu debug=smoke" in output
    assert "Traceback" not in output
    (evaluation,) = (logs / "text_detection" / "evals").iterdir()
    assert not (evaluation / "scores.json").exists()
    assert not (evaluation / "predictions.zip").exists()
    assert _half_written(evaluation) == []
    written = sorted((evaluation / "predictions").glob("res_*.txt"))
    assert len(written) == (2 if phase == "predict" else 0)  # batches 0 and 1, each whole


@pytest.mark.slow
def test_sigterm_mid_export_exits_143_and_leaves_no_model(
    compose_config, tmp_path, shared_data_dir
):
    ckpt = _checkpoint(compose_config, tmp_path / "model.ckpt")
    logs = tmp_path / "logs"
    export = subprocess.Popen(
        script_command(
            "scripts/export.py",
            "+hw=cpu",
            "debug=smoke",
            f"ckpt_path={ckpt}",
            "export.exporter=torchscript",
            f"paths.log_dir={logs}",
            f"paths.data_dir={shared_data_dir}",
        ),
        cwd=tmp_path,
        env=script_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + 240
    # The fp32 model is made: quantisation and the parity check are still to run.
    while not list(logs.glob(f"text_detection/exports/*/{STAGING_PREFIX}*/dbnet.onnx")):
        assert export.poll() is None and time.monotonic() < deadline, export.communicate()[0]
        time.sleep(0.05)
    export.send_signal(signal.SIGTERM)
    output, _ = export.communicate(timeout=120)
    assert export.returncode == 143, output[-3000:]
    assert "SIGTERM: the export stopped before it finished and wrote no models" in output
    assert "run it again: python scripts/export.py +hw=cpu debug=smoke ckpt_path=" in output
    (folder,) = (logs / "text_detection" / "exports").iterdir()
    assert not list(folder.glob("*.onnx")) and not (folder / "export.json").exists()
    assert _half_written(folder) == []
