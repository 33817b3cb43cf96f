"""``--cfg job --resolve`` with no ``+hw=`` profile is one line and exit 2, not OmegaConf's
traceback for the missing ``${hw.…}`` values."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from vramkit.core.run.settling.compose import REPO_ROOT
from vramkit.core.run.settling.config_preview import (
    preview_problem,
    prints_config,
    refuse_preview_without_profile,
)


@pytest.mark.parametrize(
    "argv",
    [
        ["+hw=t4", "--cfg", "job", "--resolve"],  # a profile for ${hw.…} to read
        ["++hw=cpu", "--cfg", "job", "--resolve"],
        ["--cfg", "job"],  # unresolved: the interpolations are shown as written
        ["debug=smoke"],  # a run settles its profile before anything reads it
    ],
)
def test_a_preview_with_a_profile_or_without_resolving_is_left_to_hydra(argv):
    assert preview_problem(argv) is None


def test_resolving_without_a_profile_names_the_profiles_and_the_settled_view(capsys):
    argv = ["+hw.batch_size=8", "--cfg", "job", "--resolve"]  # hw.* keys alone are no profile
    with pytest.raises(SystemExit) as stop:
        refuse_preview_without_profile(argv)
    (line,) = capsys.readouterr().err.splitlines()
    assert stop.value.code == 2
    assert "no +hw=<profile> was given" in line and "t4" in line and "rtx2060_super" in line
    assert "scripts/plan_memory.py +hw=<profile> --print-config" in line


def test_train_py_refuses_before_hydra_composes(tmp_path):
    command = [sys.executable, str(REPO_ROOT / "train.py"), "--cfg", "job", "--resolve"]
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.startswith("error: --resolve shows the config before the run settles")


@pytest.mark.parametrize(
    ("argv", "prints"),
    [
        (["--cfg", "job"], True),
        (["-c", "all", "debug=smoke"], True),
        (["--cfg=hydra"], True),
        (["--info", "config"], True),
        (["debug=smoke", "callbacks=default"], False),  # a run: class defaults read when built
    ],
)
def test_a_printed_config_is_told_from_a_run(argv, prints):
    assert prints_config(argv) is prints


def test_cfg_job_shows_class_defaults_as_values(tmp_path):
    # --cfg job prints the config unresolved: without the values it showed ${settings_default:…}
    command = [sys.executable, str(REPO_ROOT / "train.py"), "--cfg", "job"]
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "settings_default" not in done.stdout
    data = re.search(r"^data:\n((?:  .*\n)+)", done.stdout, re.MULTILINE).group(1)
    assert "  strict: false\n" in data and "  persistent_workers: true\n" in data
    trainer = re.search(r"^trainer:\n((?:  .*\n)+)", done.stdout, re.MULTILINE).group(1)
    assert "  log_every_n_steps: 10\n" in trainer and "  num_sanity_val_steps: 0\n" in trainer


@pytest.mark.parametrize("shown", ["job", "all"])
def test_a_resolved_preview_creates_no_run_folder(tmp_path, shown):
    # hydra.run.dir is ${run_folder:…}: printed resolved, it names a folder and makes none
    logs = tmp_path / "logs"
    command = [sys.executable, str(REPO_ROOT / "train.py"), "+hw=cpu", f"paths.log_dir={logs}"]
    done = subprocess.run(
        [*command, "--cfg", shown, "--resolve"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    if shown == "all":  # Hydra's node too
        assert str(logs / "text_detection" / "runs") in done.stdout  # the folder's name, read
    assert not logs.exists(), "reading the config created a folder"
