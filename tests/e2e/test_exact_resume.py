"""Kill a real ``train()`` run with SIGKILL anywhere, resume it from ``last.ckpt``: it ends with
bitwise the same weights, optimizer state and step, and the same best checkpoint, as a run that
was never interrupted. A SIGTERM on an epoch's last batch (before its validation) resumes into that
validation.

The killed run is a forked child of the test process (it inherits the imported modules, so it
starts in milliseconds) that sends itself SIGKILL at the drill's point: inside an epoch after a
training step, in the middle of a validation pass, or at the start of an epoch (just after the
previous epoch's checkpoint). The resumed run writes into the killed run's folder, as a user's
``python train.py ckpt_path=<run>/checkpoints/last.ckpt`` does.
"""

from __future__ import annotations

import csv
import multiprocessing
import os
import random
import signal
from pathlib import Path
from typing import Any

import cv2
import lightning as L
import pytest
import torch
from omegaconf import DictConfig
from tiny_runs import TINY_ARC, flat_tensors

from vramkit.core.run.settling import compose
from vramkit.core.run.train import train

EPOCHS = 2
TRAIN_BATCHES = 4  # debug=smoke: 16 images, batches of 4
VAL_BATCHES = 2  # 4 images, batches of 2
TINY = (
    "+hw=cpu",
    "debug=smoke",
    "logger=csv",
    f"trainer.max_epochs={EPOCHS}",
    "trainer.max_time=null",  # a wall-clock limit would make the runs differ
    "batch_size_defaults.val=2",
    "callbacks.last_checkpoint.every_n_train_steps=1",
    "callbacks.last_checkpoint.min_interval_s=0",
    "callbacks.progress_bar.refresh_rate=0",
)


class KillSelf(L.Callback):
    """SIGKILL to its own process at one point of the run: (hook, epoch, batch)."""

    def __init__(self, hook: str, epoch: int, batch: int) -> None:
        self.at = (hook, epoch, batch)

    def _maybe_kill(self, hook: str, trainer: L.Trainer, batch: int) -> None:
        if (hook, trainer.current_epoch, batch) == self.at:
            os.kill(os.getpid(), signal.SIGKILL)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self._maybe_kill("train_batch_end", trainer, batch_idx)

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, *_) -> None:
        if not trainer.sanity_checking:
            self._maybe_kill("validation_batch_end", trainer, batch_idx)

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        self._maybe_kill("train_epoch_start", trainer, 0)


def _config(run_dir: Path, data_dir: Path, *overrides: str) -> DictConfig:
    # Paths as overrides: a run composes its config again from them.
    paths = (f"paths.log_dir={run_dir.parent / 'logs'}", f"paths.data_dir={data_dir}")
    return compose.compose_config("train", [*TINY, *overrides, *paths], output_dir=run_dir)


def _final_state(run_dir: Path) -> dict[str, Any]:
    checkpoint = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    (ranking,) = [
        state
        for state in checkpoint["callbacks"].values()
        if isinstance(state, dict) and state.get("monitor") is not None
    ]
    return {
        "global_step": checkpoint["global_step"],
        "epoch": checkpoint["epoch"],
        # the best checkpoint's score and file (its folder is the run's)
        "best": (float(ranking["best_model_score"]), Path(ranking["best_model_path"]).name),
        "weights": checkpoint["state_dict"],
        "optimizer": checkpoint["optimizer_states"][0]["state"],
    }


def _validations(run_dir: Path) -> list[dict[str, str]]:
    """Every logged validation (its epoch, step and val/ metrics), over the run's resumes."""
    rows = []
    for metrics in sorted(run_dir.glob("csv/version_*/metrics.csv")):
        with metrics.open() as handle:
            rows += [
                {key: value for key, value in row.items() if value and key.startswith("val/")}
                | {"epoch": row["epoch"], "step": row["step"]}
                for row in csv.DictReader(handle)
                if row.get("val/hmean")
            ]
    return rows


def _differences(expected: dict[str, Any], actual: dict[str, Any]) -> list[str]:
    problems = [
        f"{key}: {actual[key]} != {expected[key]}"
        for key in ("global_step", "epoch", "best")
        if actual[key] != expected[key]
    ]
    for part in ("weights", "optimizer"):
        flat_expected = flat_tensors(expected[part])
        flat_actual = flat_tensors(actual[part])
        assert flat_expected.keys() == flat_actual.keys()
        problems += [
            f"{part} {name}: max |diff| "
            f"{(flat_actual[name].double() - tensor.double()).abs().max():.3g}"
            for name, tensor in flat_expected.items()
            if not torch.equal(tensor, flat_actual[name])
        ]
    return problems


def _killed_at(kill_at: tuple[str, int, int]) -> tuple[str, ...]:
    """The overrides that add a `KillSelf` callback at (hook, epoch, batch)."""
    hook, epoch, batch = kill_at
    node = f"_target_:{KillSelf.__module__}.KillSelf,hook:{hook},epoch:{epoch},batch:{batch}"
    return (f"+callbacks.kill_self={{{node}}}",)


def _run_killed(cfg: DictConfig) -> int | None:
    child = multiprocessing.get_context("fork").Process(target=train, args=(cfg,))
    child.start()
    child.join(timeout=120)
    return child.exitcode


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory, shared_data_dir: Path):
    """The final state of the uninterrupted run (0 loader workers)."""
    # A child forked while OpenCV's thread pool runs hangs in its first parallel OpenCV call
    # (the text-detection datamodule stops the pool before forking loader workers, likewise).
    cv2.setNumThreads(1)
    run_dir = tmp_path_factory.mktemp("uninterrupted") / "run"
    try:
        train(_config(run_dir, shared_data_dir, "data.num_workers=0"))
    finally:
        compose.forget_composition()
    return _final_state(run_dir) | {"validations": _validations(run_dir)}


# Kill points drawn once from a fixed seed (so a failure names a point that reproduces it).
# Mid-epoch: at the end of training batch b >= 1 before its checkpoint is written, so the run
# resumes inside the epoch from batch b - 1 and trains batch b again. In validation: after a
# validation batch that is not the last one, in an epoch that training continues after.
_DRAW = random.Random(2024)
MID_EPOCH = ("train_batch_end", _DRAW.randrange(EPOCHS), _DRAW.randrange(1, TRAIN_BATCHES))
IN_VALIDATION = (
    "validation_batch_end",
    _DRAW.randrange(EPOCHS - 1),
    _DRAW.randrange(VAL_BATCHES - 1),
)
EPOCH_BOUNDARY = ("train_epoch_start", EPOCHS - 1, 0)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("kill_at", "workers"),
    [
        (MID_EPOCH, 1),
        (IN_VALIDATION, 0),
        (EPOCH_BOUNDARY, 0),
    ],
    # Workers change where samples are made, not where the run stops: one kill point with a
    # worker (0 and 1 workers giving the same batches is tests/core/data's).
    ids=["mid_epoch-w1", "in_validation-w0", "epoch-w0"],
)
def test_a_run_killed_anywhere_resumes_to_the_same_weights(
    kill_at, workers, uninterrupted, tmp_path, shared_data_dir
):
    run_dir = tmp_path / "run"
    workers_override = f"data.num_workers={workers}"
    try:
        exit_code = _run_killed(
            _config(run_dir, shared_data_dir, workers_override, *_killed_at(kill_at))
        )
        assert exit_code == -signal.SIGKILL, f"the drill did not kill the run at {kill_at}"
        killed_at = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)
        assert killed_at["global_step"] < EPOCHS * TRAIN_BATCHES, "nothing was left to resume"
        last = run_dir / "checkpoints" / "last.ckpt"
        train(_config(run_dir, shared_data_dir, workers_override, f"ckpt_path={last}"))
    finally:
        compose.forget_composition()
    problems = _differences(uninterrupted, _final_state(run_dir))
    assert not problems, (
        f"killed at {kill_at} (step {killed_at['global_step']}) with {workers} workers, "
        f"the resumed run differs from the uninterrupted one in {len(problems)} values: "
        + "; ".join(problems[:8])
    )


@pytest.mark.slow
def test_a_sigterm_on_an_epochs_last_batch_resumes_into_its_validation(
    uninterrupted, tmp_path, shared_data_dir
):
    """Stopped after epoch 0's last training step, before its validation: the resumed run
    validates epoch 0 first, so it logs and ranks the same validations as the straight run."""
    run_dir = tmp_path / "run"
    stop = (
        "+callbacks.drill._target_=drill_callbacks.SignalAtStep",
        f"+callbacks.drill.signum={int(signal.SIGTERM)}",
        f"+callbacks.drill.step={TRAIN_BATCHES}",  # the end of epoch 0's last batch
    )
    try:
        with pytest.raises(SystemExit) as stopped:
            train(_config(run_dir, shared_data_dir, "data.num_workers=0", *stop))
        assert stopped.value.code == 128 + signal.SIGTERM
        last = run_dir / "checkpoints" / "last.ckpt"
        stopped_at = torch.load(last, weights_only=True)
        assert (stopped_at["epoch"], stopped_at["global_step"]) == (0, TRAIN_BATCHES)
        assert not _validations(run_dir), "the stop came before epoch 0's validation"
        train(_config(run_dir, shared_data_dir, "data.num_workers=0", f"ckpt_path={last}"))
    finally:
        compose.forget_composition()
    assert _validations(run_dir) == uninterrupted["validations"]
    problems = _differences(uninterrupted, _final_state(run_dir))
    assert not problems, (
        f"stopped on epoch 0's last batch, the resumed run differs from the uninterrupted one in "
        f"{len(problems)} values: " + "; ".join(problems[:8])
    )


# The SAGE teacher: length-bucketed batches (a batch sampler, not a sample order) of examples
# augmented at every access; 12 examples in batches of 2 per epoch.
SAGE_TINY = (
    "task=arc_teacher",
    "+hw=cpu",
    "hw.batch_size=2",
    "hw.val_batch_size=2",
    *TINY_ARC,
    "logger=csv",
    f"trainer.max_epochs={EPOCHS}",
    "trainer.max_time=null",
    "callbacks.last_checkpoint.every_n_train_steps=1",
    "callbacks.last_checkpoint.min_interval_s=0",
    "callbacks.progress_bar.refresh_rate=0",
)
SAGE_TRAIN_BATCHES = 6
SAGE_MID_EPOCH = (
    "train_batch_end",
    random.Random(2025).randrange(EPOCHS),
    random.Random(2026).randrange(1, SAGE_TRAIN_BATCHES),
)


def _sage_config(run_dir: Path, *overrides: str) -> DictConfig:
    logs = f"paths.log_dir={run_dir.parent / 'logs'}"
    return compose.compose_config("train", [*SAGE_TINY, *overrides, logs], output_dir=run_dir)


@pytest.mark.slow
# One loader worker: the batches and their augmentation come from another process, the harder
# case; 0 and 1 workers giving the same batches is tests/tasks/sage/data/test_arc_batching.py's.
@pytest.mark.parametrize("workers", [1])
def test_a_sage_run_killed_mid_epoch_resumes_to_the_same_weights(workers, tmp_path):
    workers_override = f"hw.num_workers={workers}"
    straight_dir, run_dir = tmp_path / "straight", tmp_path / "run"
    try:
        train(_sage_config(straight_dir, workers_override))
        exit_code = _run_killed(
            _sage_config(run_dir, workers_override, *_killed_at(SAGE_MID_EPOCH))
        )
        assert exit_code == -signal.SIGKILL, f"the drill did not kill the run at {SAGE_MID_EPOCH}"
        killed_at = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)
        assert killed_at["global_step"] % SAGE_TRAIN_BATCHES != 0, "killed at an epoch boundary"
        last = run_dir / "checkpoints" / "last.ckpt"
        train(_sage_config(run_dir, workers_override, f"ckpt_path={last}"))
    finally:
        compose.forget_composition()
    problems = _differences(_final_state(straight_dir), _final_state(run_dir))
    assert not problems, (
        f"killed at {SAGE_MID_EPOCH} (step {killed_at['global_step']}) with {workers} workers, "
        f"the resumed run differs from the uninterrupted one in {len(problems)} values: "
        + "; ".join(problems[:8])
    )
