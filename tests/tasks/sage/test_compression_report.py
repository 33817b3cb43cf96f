"""The compression report: representative latency batches, ratios, and the printed table."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from vramkit.tasks.sage.compression_report import (
    ModelRow,
    build_report,
    format_report,
    latency_batches,
    measure_latency_ms,
)
from vramkit.tasks.sage.data.arc_examples import INPUT_KEYS
from vramkit.tasks.sage.distill_module import student_scores
from vramkit.tasks.sage.grid_module import SCORES_KEY


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


def _trainer(best_model_path: str = "", score: float | None = None) -> SimpleNamespace:
    callback = SimpleNamespace(
        monitor="val/changed_cell_acc",
        best_model_path=best_model_path,
        best_model_score=None if score is None else torch.tensor(score),
    )
    return SimpleNamespace(checkpoint_callback=callback)


def test_the_student_is_the_best_checkpoint_and_scored_from_it(tmp_path):
    at_best = {"": {"cell_acc": 0.75, "changed_cell_acc": 0.2}, "copy_": {"cell_acc": 0.76}}
    at_end = {"": {"cell_acc": 0.71, "changed_cell_acc": 0.1}, "copy_": {"cell_acc": 0.76}}
    best = tmp_path / "epoch_000.ckpt"
    torch.save({"epoch": 0, SCORES_KEY: at_best}, best)
    scores, student = student_scores(_trainer(str(best), 0.2), at_end)
    assert scores == at_best  # that file's scores, not the last epoch's
    assert student["path"] == str(best) and student["epoch"] == 0
    assert student["description"].startswith(f"{best}: the best val/changed_cell_acc (0.2000)")
    # no ranked checkpoint (fast_dev_run): the last validation, and it says so
    scores, student = student_scores(_trainer(), at_end)
    assert scores == at_end and student["path"] is None
    assert "no checkpoint ranked" in student["description"]
    # a checkpoint saved before its weights were scored (an older run's) is not taken for them
    unscored = tmp_path / "old.ckpt"
    torch.save({"epoch": 3}, unscored)
    scores, student = student_scores(_trainer(str(unscored), 0.2), at_end)
    assert scores == at_end and f"{unscored} holds no scores" in student["description"]


def test_the_table_shows_changed_cells_side_by_side():
    scores = {"cell_acc": 0.7, "changed_cell_acc": 0.125, "exact_match": 0.0, "size_acc": 0.5}
    rows = [
        ModelRow("teacher", 3, {1: 1.0, 32: 9.0}, scores),
        ModelRow("copy_input", 0, {}, scores),
    ]
    table = format_report(build_report(rows, device="cpu", batch_sizes=(1, 32)))
    header = table.splitlines()[1]
    assert header.index("cell_acc") < header.index("changed_cell_acc") < header.index("size_acc")
    assert "0.1250" in table
