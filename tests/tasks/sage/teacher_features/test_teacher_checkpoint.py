"""Teachers: the newest arc_teacher run, plug-in modules from a local state_dict, clear errors."""

from __future__ import annotations

import os
import time

import pytest
import torch
from torch import nn

from vramkit.tasks.sage.grid_transformer import GridTransformer
from vramkit.tasks.sage.teacher_features.teacher_checkpoint import (
    file_sha256,
    find_latest_teacher,
    load_teacher,
    resolve_teacher_checkpoint,
)

PLUG_IN = {
    "_target_": "vramkit.tasks.sage.grid_transformer.GridTransformer",
    "d_model": 8,
    "num_layers": 1,
    "num_heads": 2,
    "ffn_dim": 16,
}


def _checkpoint(path, mtime: float):
    path.parent.mkdir(parents=True)
    path.write_bytes(b"x")
    os.utime(path, (mtime, mtime))
    return path


def test_latest_is_the_newest_last_checkpoint(tmp_path):
    now = time.time()
    old = _checkpoint(tmp_path / "arc_teacher/runs/a/checkpoints/last.ckpt", now - 100)
    new = _checkpoint(tmp_path / "arc_teacher/runs/b/checkpoints/last.ckpt", now)
    assert find_latest_teacher(tmp_path) == new
    assert resolve_teacher_checkpoint(str(old), log_dir=tmp_path) == old
    assert resolve_teacher_checkpoint("latest", log_dir=tmp_path) == new


def test_no_teacher_names_the_training_command(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"python train\.py task=arc_teacher"):
        resolve_teacher_checkpoint("latest", log_dir=tmp_path)
    with pytest.raises(FileNotFoundError, match=r"no file at .*missing\.ckpt"):
        resolve_teacher_checkpoint(str(tmp_path / "missing.ckpt"), log_dir=tmp_path)


def test_a_plug_in_teacher_loads_from_a_plain_state_dict(tmp_path):
    torch.manual_seed(0)
    original = GridTransformer(d_model=8, num_layers=1, num_heads=2, ffn_dim=16)
    torch.save(original.state_dict(), tmp_path / "weights.pt")
    loaded = load_teacher(tmp_path / "weights.pt", PLUG_IN)
    assert loaded.state_dict_prefix == "" and loaded.config["d_model"] == 8
    for name, value in original.state_dict().items():
        assert torch.equal(loaded.module.state_dict()[name], value)
    assert not loaded.module.training


def test_a_prefixed_lightning_style_checkpoint_loads(tmp_path):
    original = GridTransformer(d_model=8, num_layers=1, num_heads=2, ffn_dim=16)
    state = {"state_dict": {f"backbone.{k}": v for k, v in original.state_dict().items()}}
    torch.save(state, tmp_path / "vlm.ckpt")
    loaded = load_teacher(tmp_path / "vlm.ckpt", PLUG_IN, state_dict_prefix="backbone.")
    assert torch.equal(loaded.module.token_embedding.weight, original.token_embedding.weight)
    with pytest.raises(KeyError, match=r"state_dict_prefix=.head\.."):
        load_teacher(tmp_path / "vlm.ckpt", PLUG_IN, state_dict_prefix="head.")


class NotATeacher(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(2, 2)


def test_a_module_without_the_teacher_interface_is_refused(tmp_path):
    torch.save(NotATeacher().state_dict(), tmp_path / "w.pt")
    config = {"_target_": f"{__name__}.NotATeacher"}
    with pytest.raises(TypeError, match=r"feature_width.*encode_inputs"):
        load_teacher(tmp_path / "w.pt", config)


def test_a_checkpoint_that_names_no_network_needs_teacher_net(tmp_path):
    torch.save({"state_dict": {}}, tmp_path / "other.ckpt")
    with pytest.raises(ValueError, match=r"not a task=arc_teacher checkpoint.*teacher\.net"):
        load_teacher(tmp_path / "other.ckpt")


def test_sha256_of_a_file(tmp_path):
    (tmp_path / "f").write_bytes(b"abc")
    expected = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    assert file_sha256(tmp_path / "f") == expected
