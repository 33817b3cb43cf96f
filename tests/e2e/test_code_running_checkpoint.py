"""A checkpoint whose pickle would run a command is handed to every entry point that reads one:
the command never runs, the refusal is one line with exit status 2, and no folder is left.

The file is a real ``torch.save`` archive holding a ``state_dict`` and an object whose unpickling
calls ``os.system("touch <marker>")``: an unrestricted ``torch.load`` creates the marker.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from tests.e2e.entry_points import run_entry_point
from vramkit.core.config.schema import ConfigError
from vramkit.core.io.checkpoint_io import AtomicCheckpointIO, read_checkpoint
from vramkit.core.io.safe_load import UnsafeFileError, load_array, load_weights_only
from vramkit.core.run.records.run_diff import load_run
from vramkit.core.run.records.run_summary import _saved_epoch
from vramkit.tasks.sage.teacher_features.teacher_checkpoint import TEACHER_NETWORK_KEY, load_teacher
from vramkit.tasks.text_detection.network.backbone import (
    BackboneWeightsError,
    ResNetBackbone,
    load_backbone_weights,
)


class RunsACommand:
    """Unpickled without restriction, this calls ``os.system(command)``."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self):
        return (os.system, (self.command,))


@pytest.fixture
def marker(tmp_path):
    return tmp_path / "the_pickle_ran"


@pytest.fixture
def evil_ckpt(tmp_path, marker):
    """A Lightning-looking checkpoint whose unpickling would create ``marker``."""
    path = tmp_path / "downloaded" / "last.ckpt"
    path.parent.mkdir()
    torch.save(
        {"state_dict": {"w": torch.zeros(1)}, "epoch": 0, "x": RunsACommand(f"touch {marker}")},
        path,
    )
    return path


def _one_line(code: int, err: str) -> str:
    assert code == 2, err
    assert "Traceback" not in err, err
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and len(err.strip().splitlines()) == 1, err
    return errors[0]


def test_an_unrestricted_load_would_run_it(evil_ckpt, marker):
    # The drill is real: this file runs its command when unpickled the old way.
    torch.load(evil_ckpt, weights_only=False)
    assert marker.exists()


def test_the_safe_loader_refuses_it_naming_the_call(evil_ckpt, marker):
    with pytest.raises(UnsafeFileError, match=r"would call posix\.system"):
        load_weights_only(evil_ckpt)
    with pytest.raises(UnsafeFileError, match=r"would call posix\.system"):
        read_checkpoint(evil_ckpt)
    assert not marker.exists()


def test_lightnings_resume_load_refuses_it_even_when_torch_is_told_to_trust(
    evil_ckpt, marker, monkeypatch
):
    # Lightning passes weights_only=None, which this variable turns into a full unpickling.
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    with pytest.raises(UnsafeFileError):
        AtomicCheckpointIO().load_checkpoint(evil_ckpt, weights_only=None)
    assert not marker.exists()


def test_a_path_hyperparameter_still_loads(tmp_path):
    path = tmp_path / "c.ckpt"
    torch.save({"state_dict": {}, "hyper_parameters": {"weights": tmp_path / "w.pt"}}, path)
    assert read_checkpoint(path)["hyper_parameters"]["weights"] == tmp_path / "w.pt"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("script", "setting"),
    [
        ("train.py", "ckpt_path"),
        ("train.py", "init_from"),
        ("eval.py", "ckpt_path"),
        ("scripts/export.py", "ckpt_path"),
    ],
)
def test_every_entry_point_refuses_it_in_one_line_and_leaves_no_folder(
    monkeypatch, capsys, tmp_path, evil_ckpt, marker, script, setting
):
    logs = tmp_path / "logs"
    code, err = run_entry_point(
        monkeypatch,
        capsys,
        script,
        "+hw=cpu",
        "debug=smoke",
        f"paths.log_dir={logs}",
        f"{setting}={evil_ckpt}",
    )
    line = _one_line(code, err)
    assert line.startswith(f"error: {setting}: {evil_ckpt} is refused: loading it would call")
    assert not marker.exists()
    assert not logs.exists(), "no run folder, no exports/ folder"


@pytest.mark.slow
def test_the_teacher_feature_extraction_refuses_it(
    monkeypatch, capsys, tmp_path, evil_ckpt, marker
):
    logs = tmp_path / "logs"
    code, err = run_entry_point(
        monkeypatch,
        capsys,
        "scripts/extract_teacher_features.py",
        "task=sage_distill",
        "+hw=cpu",
        "data.limit_tasks=2",
        f"paths.log_dir={logs}",
        f"data.feature_cache={tmp_path / 'cache'}",
        f"teacher.checkpoint={evil_ckpt}",
    )
    line = _one_line(code, err)
    assert line.startswith(f"error: teacher.checkpoint: {evil_ckpt} is refused"), line
    assert not marker.exists()
    assert not logs.exists() and not (tmp_path / "cache").exists()


def test_a_teacher_checkpoint_naming_a_network_outside_vramkit_builds_nothing(tmp_path, marker):
    for network in (
        {"_target_": "os.system", "command": f"touch {marker}"},  # a callable of its choosing
        {  # one of ours, with an argument Hydra's instantiate would call or resolve
            "_target_": "vramkit.tasks.sage.grid_transformer.GridTransformer",
            "d_model": {"_target_": "os.system", "command": f"touch {marker}"},
        },
        {
            "_target_": "vramkit.tasks.sage.grid_transformer.GridTransformer",
            "d_model": "${run_folder:" + str(marker) + "}",
        },
    ):
        torch.save({"state_dict": {}, TEACHER_NETWORK_KEY: network}, tmp_path / "t.ckpt")
        with pytest.raises(ConfigError, match=r"^teacher\.checkpoint: "):
            load_teacher(tmp_path / "t.ckpt")
        assert not marker.exists()


def test_the_teacher_checkpoint_and_backbone_weights_refuse_it(evil_ckpt, marker):
    with pytest.raises(ConfigError, match=r"^teacher\.checkpoint: .* is refused"):
        load_teacher(evil_ckpt)
    with pytest.raises(BackboneWeightsError, match=r"is refused: loading it would call"):
        load_backbone_weights(ResNetBackbone(width=0.25), evil_ckpt)
    assert not marker.exists()


def test_an_array_file_holding_a_pickle_is_refused(tmp_path, marker):
    objects = tmp_path / "train_index.npy"
    np.save(objects, np.array([RunsACommand(f"touch {marker}")], dtype=object), allow_pickle=True)
    for mmap in (False, True):
        with pytest.raises(UnsafeFileError, match=r"holds a pickle"):
            load_array(objects, mmap=mmap)
    assert not marker.exists()
    numbers = tmp_path / "numbers.npy"
    np.save(numbers, np.arange(4))
    assert load_array(numbers, mmap=True).tolist() == [0, 1, 2, 3]


def test_compare_and_the_run_summary_never_unpickle_it(tmp_path, evil_ckpt, marker):
    run = evil_ckpt.parent
    (run / "resolved_config.yaml").write_text(OmegaConf.to_yaml({"seed": 1}))
    config, _ = load_run(evil_ckpt)  # compare reads the run folder's records, not the pickle
    assert config["seed"] == 1
    assert _saved_epoch(evil_ckpt) is None  # the summary line goes without it
    assert not marker.exists()
