"""``vramkit train`` and ``vramkit eval`` run the flow of ``python train.py`` / ``python eval.py``:
the same run folders (``logs/<task>/runs/<time>/`` with ``train.log``, checkpoints and the resolved
config; ``logs/<task>/evals/<time>/`` with ``eval.log`` and ``scores.json``), and eval's refusal of
an eval batch its inference plan says does not fit, in one line with exit status 2."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
from hydra.core.hydra_config import HydraConfig

from vramkit.cli import main
from vramkit.core.hardware.detect import DeviceInfo
from vramkit.core.run.settling.compose import forget_composition

TINY = ("+hw=cpu", "debug=smoke", "logger=csv")
T4 = DeviceInfo("cuda", "Tesla T4", 14.57, (7, 5), count=1, cpu_count=2)
# A T4 shrunk to a 0.91 GiB budget, with 1024-px validation images: DBNet-tiny's inference plan
# fits 2 images (about 0.85 GiB with the CUDA context), not 3 (0.97 GiB).
SMALL_T4 = ("+hw=t4", "debug=smoke", "hw.memory_gib=1.07", "data.val_image_size=1024")


@pytest.fixture
def cli_runs(tmp_path: Path, shared_data_dir: Path, monkeypatch: pytest.MonkeyPatch):
    """The log and data folders of the test's runs; Hydra's state restored after them."""
    monkeypatch.chdir(tmp_path)
    saved = HydraConfig.instance().cfg
    yield (f"paths.log_dir={tmp_path / 'logs'}", f"paths.data_dir={shared_data_dir}")
    HydraConfig.instance().cfg = saved
    forget_composition()


def test_vramkit_train_then_eval_write_the_run_folders_of_train_py_and_eval_py(
    cli_runs, tmp_path, monkeypatch, capsys
):
    argv = list(sys.argv)
    quiet = ("callbacks.progress_bar.refresh_rate=0", "callbacks.run_report=null")  # 4 s less
    assert main(["train", *TINY, *quiet, *cli_runs]) == 0
    assert sys.argv == argv  # Hydra's command line is the subcommand's only while it runs
    task_dir = tmp_path / "logs" / "text_detection"
    (run,) = (task_dir / "runs").iterdir()
    for name in ("train.log", "resolved_config.yaml", "job_result.json", ".hydra/overrides.yaml"):
        assert (run / name).is_file(), name
    assert "debug=smoke" in (run / ".hydra" / "overrides.yaml").read_text()
    last = run / "checkpoints" / "last.ckpt"

    capsys.readouterr()
    assert main(["eval", *TINY, f"ckpt_path={last}", *cli_runs]) == 0
    (evaluation,) = (task_dir / "evals").iterdir()
    scores = json.loads((evaluation / "scores.json").read_text())
    assert set(scores) == {"val/precision", "val/recall", "val/hmean"}
    assert json.loads(capsys.readouterr().out.splitlines()[-1]) == scores
    assert (evaluation / "eval.log").is_file() and list(evaluation.glob("predictions/res_*.txt"))

    # On a (faked) T4, a set eval batch over the inference plan is refused before any work.
    monkeypatch.setattr("vramkit.core.run.settling.settle.probe_device", lambda: T4)
    override = "hw.val_batch_size=4"
    status = main(["eval", *SMALL_T4, override, f"ckpt_path={last}", *cli_runs])
    error = capsys.readouterr().err
    assert status == 2 and "Traceback" not in error
    (line,) = [line for line in error.splitlines() if line.startswith("error: ")]
    assert line.startswith(
        f"error: hw.val_batch_size=4 (conf/hw/t4.yaml; command-line override '{override}') "
        "does not fit NVIDIA T4's budget of 0.91 GiB for evaluation"
    )
    largest = re.search(r"the largest that fits is (\d+): set hw.val_batch_size=(\d+)$", line)
    assert largest and largest[1] == largest[2] and 1 <= int(largest[1]) < 4
    # Refused before any work: no folder, as a refused train.py leaves none.
    assert list((task_dir / "evals").iterdir()) == [evaluation]
