"""The GPU accuracy benchmark refuses clearly where there is no GPU to compare with."""

from __future__ import annotations

import pytest
import torch

from benchmarks import planner_accuracy


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without CUDA")
def test_without_a_gpu_the_benchmark_says_why(capsys):
    assert planner_accuracy.main(["--batch-sizes", "4"]) == 2
    error = capsys.readouterr().err
    assert "needs a CUDA GPU" in error and "scripts/plan_memory.py" in error
