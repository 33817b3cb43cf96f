import errno
import shutil

import pytest
import torch

from vramkit.core.io import checkpoint_io
from vramkit.core.io.checkpoint_io import AtomicCheckpointIO
from vramkit.core.io.disk_space import (
    PICKLE_ALLOWANCE_BYTES,
    DiskFullError,
    checkpoint_bytes,
    ran_out_of_space,
)


def _free_space(monkeypatch, free: int) -> None:
    real = shutil.disk_usage

    def reported(path):
        usage = real(path)
        return type(usage)(usage.total, usage.total - free, free)

    monkeypatch.setattr(shutil, "disk_usage", reported)


def test_checkpoint_bytes_counts_each_storage_once_and_whole():
    weight = torch.zeros(256, 256)  # 256 KiB
    checkpoint = {"state_dict": {"w": weight, "w_view": weight[:1], "tied": weight}, "epoch": 3}
    checkpoint["optimizer"] = [{"exp_avg": torch.zeros(1000, dtype=torch.float16)}]
    assert checkpoint_bytes(checkpoint) == 256 * 256 * 4 + 2000 + PICKLE_ALLOWANCE_BYTES


def test_a_write_the_disk_cannot_hold_is_refused_before_a_byte_is_written(tmp_path, monkeypatch):
    target = tmp_path / "last.ckpt"
    AtomicCheckpointIO().save_checkpoint({"w": torch.ones(4)}, target)
    before = target.read_bytes()
    _free_space(monkeypatch, 1024)
    with pytest.raises(DiskFullError) as refused:
        AtomicCheckpointIO().save_checkpoint({"w": torch.zeros(4)}, target)
    message = str(refused.value)
    assert f"in {tmp_path}:" in message
    assert "0.0 MiB free" in message and "16.0 MiB needed" in message
    assert message.endswith("; the previous last.ckpt is intact")
    assert target.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]


def test_a_first_write_the_disk_cannot_hold_says_none_is_left(tmp_path, monkeypatch):
    _free_space(monkeypatch, 1024)
    with pytest.raises(DiskFullError) as refused:
        AtomicCheckpointIO().save_checkpoint({"w": torch.zeros(4)}, tmp_path / "last.ckpt")
    assert "intact" not in str(refused.value)
    assert str(refused.value).endswith("; there was no earlier last.ckpt, so none is left")
    assert list(tmp_path.iterdir()) == []


def test_a_disk_that_fills_during_the_write_keeps_the_previous_file(tmp_path, monkeypatch):
    target = tmp_path / "last.ckpt"
    AtomicCheckpointIO().save_checkpoint({"w": torch.ones(4)}, target)
    before = target.read_bytes()

    def save_until_full(obj, handle):
        handle.write(b"x" * 1000)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(checkpoint_io.torch, "save", save_until_full)
    with pytest.raises(DiskFullError, match="failed after 1000 bytes") as failed:
        AtomicCheckpointIO().save_checkpoint({"w": torch.zeros(4)}, target)
    assert isinstance(failed.value.__cause__, OSError)
    assert str(failed.value).endswith("; the previous last.ckpt is intact")
    assert target.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]


def test_the_zip_writers_runtime_error_on_a_full_disk_is_recognised(tmp_path, monkeypatch):
    error = RuntimeError("[enforce fail at inline_container.cc:664] . unexpected pos 64 vs 0")
    assert not ran_out_of_space(error, tmp_path)
    _free_space(monkeypatch, 0)
    assert ran_out_of_space(error, tmp_path)
    assert ran_out_of_space(OSError(errno.ENOSPC, "full"), tmp_path)


def test_other_write_failures_are_not_reported_as_a_full_disk(tmp_path):
    assert not ran_out_of_space(PermissionError(errno.EACCES, "denied"), tmp_path)
