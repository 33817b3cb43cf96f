"""Fixtures shared by the whole suite: composed configs and the real ICDAR 2015 toy data."""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from omegaconf import DictConfig

import vramkit
from tests.slow_tests_first import order_for_workers
from vramkit.core.run.settling import compose

REPO = Path(vramkit.__file__).resolve().parents[1]
TOY_ICDAR_DIR = Path(__file__).resolve().parent / "data" / "icdar2015_toy"

os.environ.setdefault("WANDB_SILENT", "true")
# Two cores, possibly two pytest workers: one intra-op thread each avoids oversubscription.
torch.set_num_threads(1)


_JOB_HANDLERS = (logging.StreamHandler, logging.FileHandler)  # Hydra's job_logging: console, file


@pytest.fixture(autouse=True)
def _root_logger_as_before() -> Iterator[None]:
    """Give the root logger back its handlers and level after each test.

    A test that runs a Hydra job in-process leaves Hydra's console handler on the root logger,
    bound to that test's captured stream; once pytest closes the stream, a later test's warning
    prints "--- Logging error ---" into its stderr. pytest's own capture handlers come and go
    with each phase and are left alone.
    """
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    left_behind = [h for h in root.handlers if h not in handlers and type(h) in _JOB_HANDLERS]
    for handler in left_behind:
        root.removeHandler(handler)
        handler.close()
    root.setLevel(level)


@pytest.fixture(scope="session")
def toy_icdar_dir() -> Path:
    """The 7 real ICDAR 2015 images with their ground truth (images/, gt/)."""
    if not TOY_ICDAR_DIR.is_dir():
        pytest.fail(f"the toy ICDAR data is missing: {TOY_ICDAR_DIR}")
    return TOY_ICDAR_DIR


@pytest.fixture(scope="session")
def shared_data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data folder shared by the tests of one session, so datasets are rendered once.

    Under pytest-xdist each worker's base temporary folder is ``<run's basetemp>/gw<n>``
    (``xdist/workermanage.py``), so the workers share ``<run's basetemp>/data``: the default
    task's 1100 synthetic images are rendered by the first worker that needs them, not by each.
    Sharing is safe: a dataset is written to a temporary folder renamed into place, and a worker
    that loses the race uses the winner's copy (``ensure_synthetic_dataset``); cache entries are
    renamed into place likewise (``vramkit/core/io/disk_cache.py``).
    """
    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        return tmp_path_factory.mktemp("data")
    shared = tmp_path_factory.getbasetemp().parent / "data"
    shared.mkdir(exist_ok=True)
    return shared


@pytest.fixture
def compose_config(tmp_path: Path, shared_data_dir: Path) -> Iterator[Callable[..., DictConfig]]:
    """Compose ``conf/<name>.yaml`` with overrides, as ``python train.py ...`` would.

    The run's output goes to this test's tmp_path and generated data to the session's data folder.
    """

    def _compose(*overrides: str, config_name: str = "train") -> DictConfig:
        # Paths as overrides, not set afterwards: a run composes its config again from them.
        paths = (f"paths.log_dir={tmp_path / 'logs'}", f"paths.data_dir={shared_data_dir}")
        return compose.compose_config(
            config_name, (*overrides, *paths), output_dir=tmp_path / "run"
        )

    yield _compose
    compose.forget_composition()  # later tests must not see this run's Hydra settings


def _run_process_pair(worker: Path, *args: str, out_dir: Path) -> list[dict]:
    """Run ``worker`` as ranks 0 and 1 of a two-process group (``worker RANK PORT *args``); each
    rank writes ``out_dir/rank<r>.json``, which is returned. A process still running when the
    other is done (left waiting in a collective) is killed and fails the test."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    processes = [
        subprocess.Popen(
            [sys.executable, str(worker), str(rank), str(port), *args],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in (0, 1)
    ]
    try:
        for process in processes:
            _, stderr = process.communicate(timeout=120)
            assert process.returncode == 0, stderr[-3000:]
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
    return [json.loads((out_dir / f"rank{rank}.json").read_text()) for rank in (0, 1)]


@pytest.fixture(scope="session")
def run_process_pair() -> Callable[..., list[dict]]:
    """``run_process_pair(worker, *args, out_dir=...)``: a worker script run as two gloo
    processes, their JSON results (see :func:`_run_process_pair`)."""
    return _run_process_pair


LITTER = ("logs", "data", "build", "outputs", "multirun", "wandb")
"""Folders a run or a build writes into the checkout: the suite must write only under pytest's
tmp paths, so none of them may appear during it."""
CHECKOUT = Path(__file__).resolve().parents[1]
_litter_before = pytest.StashKey[set]()


@pytest.hookimpl(trylast=True)  # after `-m` has deselected: the slices are of what runs
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Set by pytest-xdist in each worker (xdist/remote.py); every worker orders alike.
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    items[:] = order_for_workers(items, workers)


def pytest_sessionstart(session: pytest.Session) -> None:
    session.config.stash[_litter_before] = {n for n in LITTER if (CHECKOUT / n).exists()}


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if hasattr(session.config, "workerinput"):  # an xdist worker: the controller checks once
        return
    before = session.config.stash.get(_litter_before, set())
    new = sorted(n for n in LITTER if (CHECKOUT / n).exists() and n not in before)
    if new:
        session.config.get_terminal_writer().line(
            f"the suite wrote into the checkout: {', '.join(f'{n}/' for n in new)} "
            "(tests must write under pytest's tmp paths)",
            red=True,
        )
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
