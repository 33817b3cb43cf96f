"""``python train.py trainer=ddp_sim`` (two CPU processes over gloo) with batch B/2 per process
ends with the weights of ``python train.py`` with batch B, for text detection (DBNet, BatchNorm
synchronised) and for the text classifier; and its two processes print every line once.

Why the runs can agree at all: each process reads every other sample of one seeded order
(:class:`~vramkit.core.data.resumable_loader.EpochOrder`), so batch k of the two processes is
batch k of the single process; a sample's augmentation is seeded by (run seed, epoch, index),
not by the process; BatchNorm statistics and DBNet's batch-pooled loss terms are sums over both
processes (:mod:`vramkit.core.distributed`). What is left is float arithmetic: a sum over B
samples is computed as two partial sums over B/2 plus one gloo all-reduce, and DDP's gradient
is (g0 + g1) / 2 where one process computes the mean over B directly. Both change float32
rounding (~1e-7 relative per operation), nothing else.

The runs step with plain SGD at a constant rate (0.01) and, for DBNet, keep every negative
pixel in the BCE term. Both choices remove a discontinuity that turns rounding into a visible
difference without any disagreement of the distributed computation:

- AdamW's first updates are about ``lr * sign(g)``: a gradient that is zero in exact arithmetic
  (attention's key bias: softmax ignores a shift shared by every key) and 1e-9 of rounding noise
  moves its weight by ``±lr``. With AdamW the same runs differ by 3e-5 (classifier) and 7e-4
  (DBNet, 4 warm-up steps): the optimizer's reading of noise.
- Hard-negative mining keeps the k largest pixel losses: two pixels whose losses differ by less
  than rounding swap in or out, which moves one pixel's share of the gradient. Across
  processes that selection is tested on one step with identical inputs
  (``tests/core/distributed``); over several steps it amplifies rounding.

What remains still grows from step to step (each gradient depends on the previous weights of a
BatchNorm network): measured, the two runs' losses agree to 1e-7 at step 0 and ~6e-7 relative
at step 3, weights differ by <= 1e-5 and running statistics by 2.5e-4 of their size. A run that
normalises each process's half alone (``trainer.sync_batchnorm=false``) differs by 3.6e-5 in its
first loss, 2.9e-4 in weights and 100% in running statistics: the tolerances below sit between.
"""

from __future__ import annotations

import csv
import re
import subprocess
from collections import Counter
from pathlib import Path

import pytest
import torch

import vramkit
from tests.e2e.script_runs import script_command, script_env

REPO = Path(vramkit.__file__).resolve().parents[1]
# see the module docstring: float32 reduction order, grown over 4 SGD steps
WEIGHT_TOLERANCE = 5e-5  # absolute, parameters
STATISTICS_TOLERANCE = 2e-3  # BatchNorm running statistics, relative to each tensor's largest
LOSS_TOLERANCE = 1e-5  # relative, train/loss of every step
COMMON = (
    "+hw=cpu",
    "trainer.max_time=null",
    "trainer.max_epochs=1",
    "data.num_workers=0",
    "trainer.log_every_n_steps=1",  # every step's loss is compared
    # SGD at a constant rate: differences stay the size of float rounding (module docstring)
    "model.optimizer._target_=torch.optim.SGD",
    "model.optimizer.lr=0.01",
    "model.optimizer.weight_decay=0",
    "model.lr_schedule.warmup_steps=0",
    "model.lr_schedule.decay=constant",
)
DETECTION = (
    "debug=smoke",  # 16 images of 128 px: 4 steps at a global batch of 4
    # every negative pixel, no hard-negative selection: see the module docstring
    "model.loss.negative_ratio=1000000",
)
CLASSIFIER = (
    "task=text_classification",
    "data.toy.num_train=32",  # 4 steps at a global batch of 8
    "data.toy.num_val=8",
    "batch_size_defaults.val=8",
)
_LOG_PREFIX = re.compile(r"^\[\d{4}-\d\d-\d\d [\d:,]+\]\[[^\]]*\]\[[A-Z]+\] - ")


def _launch(run_dir: Path, *overrides: str) -> subprocess.Popen:
    command = script_command(
        "train.py",
        *COMMON,
        *overrides,
        f"paths.data_dir={run_dir}/data",  # each run renders its own (identical) data
        f"paths.log_dir={run_dir}/logs",
        f"hydra.run.dir={run_dir}",
    )
    env = script_env(OMP_NUM_THREADS="1", WANDB_MODE="offline")
    return subprocess.Popen(
        command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def _single_and_ddp(root: Path, overrides: tuple[str, ...], batch: int) -> dict[str, object]:
    """Both runs at once (one process and two): folders and what each printed."""
    runs = {
        "single": _launch(root / "single", *overrides, f"batch_size_defaults.train={batch}"),
        "ddp": _launch(
            root / "ddp", *overrides, "trainer=ddp_sim", f"batch_size_defaults.train={batch // 2}"
        ),
    }
    printed = {}
    try:
        for name, process in runs.items():
            printed[name], _ = process.communicate(timeout=400)
            assert process.returncode == 0, f"{name} run failed:\n{printed[name][-4000:]}"
    finally:
        for process in runs.values():
            if process.poll() is None:
                process.kill()
    return {"root": root, **{f"{name}_output": text for name, text in printed.items()}}


def _last_state(run_dir: Path) -> tuple[int, dict[str, torch.Tensor]]:
    checkpoint = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=False)
    return checkpoint["global_step"], checkpoint["state_dict"]


def _step_losses(run_dir: Path) -> list[float]:
    with (run_dir / "csv" / "version_0" / "metrics.csv").open() as table:
        return [float(row["train/loss"]) for row in csv.DictReader(table) if row["train/loss"]]


def _differences(runs: dict[str, object], *, global_loss: bool) -> dict[str, object]:
    """Steps, and the largest differences of the DDP run from the single-process one.

    ``global_loss``: the logged ``train/loss`` is the global batch's on every process (DBNet's
    pooled loss), so the two runs log the same values; the classifier's process 0 logs the mean
    over its own half (without a per-step all-reduce just for the log), which is not compared.
    """
    root = runs["root"]
    steps, single = _last_state(root / "single")
    ddp_steps, ddp = _last_state(root / "ddp")
    assert steps == ddp_steps and single.keys() == ddp.keys()
    weights, statistics = (0.0, ""), (0.0, "")
    for key in single:
        difference = (single[key].double() - ddp[key].double()).abs().max().item()
        if "running_" in key:
            relative = difference / max(single[key].double().abs().max().item(), 1e-12)
            statistics = max(statistics, (relative, key))
        elif single[key].is_floating_point():
            weights = max(weights, (difference, key))
        else:  # counters
            assert difference == 0, key
    single_losses, ddp_losses = _step_losses(root / "single"), _step_losses(root / "ddp")
    assert len(single_losses) == len(ddp_losses) == steps  # log_every_n_steps=1
    pairs = zip(single_losses, ddp_losses, strict=True) if global_loss else ()
    losses = max((abs(a - b) / abs(a) for a, b in pairs), default=0.0)
    return {"steps": steps, "weights": weights, "statistics": statistics, "losses": losses}


def _check(differences: dict[str, object]) -> None:
    assert differences["steps"] >= 3
    assert differences["losses"] <= LOSS_TOLERANCE, differences
    assert differences["weights"][0] <= WEIGHT_TOLERANCE, differences
    assert differences["statistics"][0] <= STATISTICS_TOLERANCE, differences


@pytest.fixture(scope="module")
def detection_runs(tmp_path_factory) -> dict[str, object]:
    return _single_and_ddp(tmp_path_factory.mktemp("detection"), DETECTION, batch=4)


@pytest.fixture(scope="module")
def classifier_runs(tmp_path_factory) -> dict[str, object]:
    return _single_and_ddp(tmp_path_factory.mktemp("classifier"), CLASSIFIER, batch=8)


@pytest.mark.slow
def test_two_processes_train_dbnet_as_one_process_with_the_global_batch(detection_runs):
    differences = _differences(detection_runs, global_loss=True)
    print(f"text detection, single vs ddp_sim: {differences}")
    _check(differences)
    ddp_config = (detection_runs["root"] / "ddp" / "resolved_config.yaml").read_text()
    assert "sync_batchnorm: true" in ddp_config


@pytest.mark.slow
def test_two_processes_train_the_classifier_as_one_process_with_the_global_batch(
    classifier_runs,
):
    differences = _differences(classifier_runs, global_loss=False)
    print(f"text classifier, single vs ddp_sim: {differences}")
    _check(differences)


def _lines(printed: str) -> Counter:
    """Printed messages without their log prefix (time, logger, level); lines without a letter
    or digit (blank lines, rules around Lightning's "distributed_backend=gloo" block) are
    layout."""
    lines = (_LOG_PREFIX.sub("", line).strip() for line in printed.splitlines())
    return Counter(line for line in lines if any(c.isalnum() for c in line))


@pytest.mark.slow
def test_the_two_processes_print_every_line_once(detection_runs):
    single, ddp = _lines(detection_runs["single_output"]), _lines(detection_runs["ddp_output"])
    # a line a single process prints twice (a table rule, a logger's layout) may appear twice
    repeated = {line: count for line, count in ddp.items() if count > max(1, single[line])}
    assert not repeated, f"printed by both processes: {repeated}"
    assert ddp["Hardware profile"] == 1  # the profile (rank 0 only), in the DDP run too
