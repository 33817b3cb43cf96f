"""Two DDP processes (gloo, CPU): a step without an OOM starts no collective of the guard's, a
fault on one process is recovered by that process alone, and a process that cannot fit one
sample stops both, neither left waiting."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from torch.nn import functional as F

WORKER = Path(__file__).with_name("ddp_worker.py")
sys.path.insert(0, str(WORKER.parent))
from ddp_worker import EPOCHS, Regressor, points  # noqa: E402


def _reference_weights() -> dict[str, torch.Tensor]:
    """One process, the whole set per step: what DDP's gradient average must reproduce (each
    step's two per-process batches together are the whole set)."""
    module = Regressor()
    optimizer = module.configure_optimizers()
    x, y = points().tensors
    for _ in range(EPOCHS):
        optimizer.zero_grad()
        F.mse_loss(module(x), y).backward()
        optimizer.step()
    return module.state_dict()


@pytest.mark.slow
def test_no_step_starts_a_collective_and_a_one_sided_fault_keeps_the_updates(
    tmp_path, run_process_pair
):
    ranks = run_process_pair(WORKER, "split", str(tmp_path), out_dir=tmp_path)
    reference = _reference_weights()
    for rank, result in enumerate(ranks):
        # rank 0 never fails: its steps are the happy path; rank 1 recovers alone
        assert result["outcome"] == "finished"
        assert result["per_step_collectives"] == [0] * EPOCHS
        assert result["collectives"] > 0  # the counting saw Lightning's own, outside steps
        for name, value in result["weights"].items():
            torch.testing.assert_close(torch.tensor(value), reference[name], msg=f"{rank} {name}")
    # DDP's replicas: one gradient average applied to one set of weights, whatever each
    # process did to compute its share, so the processes agree bit for bit
    first, second = (result["weights"] for result in ranks)
    assert first == second
    # rank 1: 8 failed, then 4 (its last resort, in a checkpoint of its own), then 2 fitted
    assert [r["train_micro_batch"] for r in ranks] == [None, 2]
    assert (tmp_path / "checkpoints" / "oom_last_resort.rank1.ckpt").is_file()


@pytest.mark.slow
def test_a_process_that_cannot_fit_one_sample_stops_both(tmp_path, run_process_pair):
    first, second = run_process_pair(WORKER, "give_up", str(tmp_path), out_dir=tmp_path)
    assert second["outcome"].startswith("OutOfMemoryError")
    assert "nothing smaller is left" in second["outcome"]
    assert first["outcome"].startswith("OutOfMemoryError")
    assert "another process" in first["outcome"]
    assert first["per_step_collectives"] == [0]  # the first epoch's end stopped both
    assert first["weights"] == second["weights"]  # neither stepped without the other
