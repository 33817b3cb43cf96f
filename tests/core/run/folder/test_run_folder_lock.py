"""One run per folder: the lock refuses a second holder by name and takes over stale ones."""

from __future__ import annotations

import fcntl
import json
import logging
import os
import socket
import subprocess
import sys

import pytest

from vramkit.core.run.folder.run_folder_lock import LOCK_NAME, RunFolderBusyError, lock_run_folder
from vramkit.core.run.run_folder_guard import launching_process


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid  # reaped: no process has it (pids are not reused this soon)


def test_a_second_run_is_refused_naming_the_holder(tmp_path):
    held = lock_run_folder(tmp_path)
    # flock conflicts between two opens of the file, also within one process
    with pytest.raises(RunFolderBusyError) as refused:
        lock_run_folder(tmp_path)
    message = str(refused.value)
    assert f"pid {os.getpid()} on host {socket.gethostname()}, started 20" in message
    assert str(tmp_path) in message
    held.release()
    assert not (tmp_path / LOCK_NAME).exists(), "released: no lock file left behind"
    lock_run_folder(tmp_path).release()


def test_a_lock_held_by_another_process_is_refused(tmp_path):
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; "
            "from vramkit.core.run.folder.run_folder_lock import lock_run_folder; "
            f"lock_run_folder({str(tmp_path)!r}); print('held', flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(RunFolderBusyError, match=f"pid {holder.pid} "):
            lock_run_folder(tmp_path)
    finally:
        holder.kill()
        holder.wait()
    lock_run_folder(tmp_path).release()  # the kernel let the dead holder's lock go


def test_an_unlocked_lock_file_is_taken_over_with_a_warning(tmp_path, caplog):
    stale = {"pid": _dead_pid(), "host": "elsewhere", "started": "2026-01-01 00:00:00"}
    (tmp_path / LOCK_NAME).write_text(json.dumps(stale))
    with caplog.at_level(logging.WARNING):
        lock = lock_run_folder(tmp_path)
    assert f"pid {stale['pid']} on host elsewhere" in caplog.text and "takes it over" in caplog.text
    assert json.loads((tmp_path / LOCK_NAME).read_text())["pid"] == os.getpid()
    lock.release()


def test_a_lock_still_held_for_a_dead_process_of_this_host_is_taken_over(tmp_path, caplog):
    # e.g. a forked loader worker that outlived its run still holds the open file
    path = tmp_path / LOCK_NAME
    path.write_text(json.dumps({"pid": _dead_pid(), "host": socket.gethostname()}))
    orphan = os.open(path, os.O_RDWR)
    fcntl.flock(orphan, fcntl.LOCK_EX)
    try:
        with caplog.at_level(logging.WARNING):
            lock = lock_run_folder(tmp_path)
        assert "lock is taken over" in caplog.text
        assert json.loads(path.read_text())["pid"] == os.getpid()
        with pytest.raises(RunFolderBusyError):  # and it holds: nobody else gets in
            lock_run_folder(tmp_path)
        lock.release()
    finally:
        os.close(orphan)


@pytest.mark.parametrize(
    ("environ", "claims"),
    [
        ({}, True),
        ({"LOCAL_RANK": "0", "RANK": "0"}, True),
        ({"LOCAL_RANK": "1"}, False),  # a process Lightning's DDP launcher started
        ({"SLURM_PROCID": "3"}, False),
        ({"RANK": ""}, True),
    ],
)
def test_only_the_launching_process_claims_the_folder(environ, claims):
    assert launching_process(environ) is claims
