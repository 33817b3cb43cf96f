"""The compression report: representative latency batches, ratios, and the printed table."""

from __future__ import annotations

import torch

from vramkit.tasks.sage.arc_examples import INPUT_KEYS
from vramkit.tasks.sage.compression_report import (
    ModelRow,
    build_report,
    format_report,
    latency_batches,
    measure_latency_ms,
)


class _Items:
    """A dataset of 5 sequences whose lengths are 10, 50, 20, 40, 30 tokens."""

    lengths = (10, 50, 20, 40, 30)

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        length = self.lengths[index]
        sequence = torch.zeros(length, dtype=torch.long)
        grid = torch.zeros(30, 30, dtype=torch.long)
        return {
            **{key: sequence for key in ("tokens", "rows", "cols", "roles", "pairs")},
            "query_index": grid,
            "query_grid": grid,
            "target": grid,
        }


def test_latency_batches_are_typical_and_full():
    batches = latency_batches(_Items(), (1, 8), torch.device("cpu"))
    assert batches[1]["tokens"].shape == (1, 30)  # the median length
    assert batches[8]["tokens"].shape[0] == 8  # repeated to fill the batch
    assert set(batches[8]) == set(INPUT_KEYS)  # inputs only


def test_ratios_and_table():
    rows = [
        ModelRow("teacher", 300, {1: 30.0, 32: 90.0}, {"cell_acc": 0.5, "exact_match": 0.0}),
        ModelRow("student", 100, {1: 10.0, 32: 45.0}, {"cell_acc": 0.4, "exact_match": 0.0}),
        ModelRow("copy_input", 0, {}, None),
    ]
    report = build_report(rows, device="cpu", batch_sizes=(1, 32))
    assert report["parameter_ratio"] == 3.0
    assert report["latency_ratio"] == {"1": 3.0, "32": 2.0}
    table = format_report(report)
    assert "teacher/student: parameters 3.00×, latency batch 1: 3.00×, batch 32: 2.00×" in table
    (copy_row,) = [line for line in table.splitlines() if "copy_input" in line]
    assert copy_row.replace("│", " ").split()[:2] == ["copy_input", "0"]
    assert "n/a" in copy_row


def test_latency_is_a_median_of_timed_runs():
    calls = []
    assert measure_latency_ms(lambda: calls.append(1), torch.device("cpu"), repeats=3) >= 0
    assert len(calls) == 4  # one warm-up, three timed
