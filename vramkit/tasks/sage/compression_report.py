"""The compression report: what distillation kept (scores) for what it saved (size, latency).

One table, one row per model (teacher, student, and the copy-the-input baseline as the floor a
model must beat), with parameters, inference latency at each batch size on the device at hand,
and the validation scores; plus the teacher/student ratios of parameters and of latency.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset

from vramkit.core.tables import render_table
from vramkit.tasks.sage.data.arc_batching import collate_grid_items
from vramkit.tasks.sage.data.arc_examples import INPUT_KEYS
from vramkit.tasks.sage.grids.grid_metrics import SCORE_NAMES


def count_parameters(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def latency_batches(
    dataset: Dataset, batch_sizes: Sequence[int], device: torch.device
) -> dict[int, dict[str, torch.Tensor]]:
    """Input-only batches of examples of typical length: the ``b`` examples at evenly spaced
    quantiles of ``dataset.lengths`` (batch 1: the median-length example); a dataset smaller
    than a batch is repeated to fill it."""
    by_length = sorted(range(len(dataset)), key=lambda index: dataset.lengths[index])
    batches = {}
    for size in batch_sizes:
        step = len(by_length) / size
        items = [dataset[by_length[int((i + 0.5) * step) % len(by_length)]] for i in range(size)]
        batch = collate_grid_items(items)
        batches[size] = {key: batch[key].to(device) for key in INPUT_KEYS}
    return batches


def measure_latency_ms(
    run: Callable[[], Any], device: torch.device, *, repeats: int = 5, warmup: int = 1
) -> float:
    """Median wall time of ``run()`` in ms, after ``warmup`` calls (CUDA is synchronised)."""

    def synchronise() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    for _ in range(warmup):
        run()
    synchronise()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        synchronise()
        times.append((time.perf_counter() - start) * 1000.0)
    return statistics.median(times)


@dataclass
class ModelRow:
    """One row of the report."""

    name: str
    parameters: int
    latency_ms: dict[int, float | None] = field(default_factory=dict)
    scores: dict[str, float] | None = None


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or not denominator:
        return None
    return numerator / denominator


def build_report(
    rows: Sequence[ModelRow],
    *,
    device: str,
    batch_sizes: Sequence[int],
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The report as a JSON-ready dict; rows named ``teacher`` and ``student`` give the ratios."""
    by_name = {row.name: row for row in rows}
    teacher, student = by_name.get("teacher"), by_name.get("student")
    report: dict[str, Any] = {
        "device": device,
        "batch_sizes": list(batch_sizes),
        "models": {
            row.name: {
                "parameters": row.parameters,
                "latency_ms": {str(b): row.latency_ms.get(b) for b in batch_sizes},
                "scores": row.scores,
            }
            for row in rows
        },
        **dict(extra or {}),
    }
    if teacher is not None and student is not None:
        report["parameter_ratio"] = _ratio(teacher.parameters, student.parameters)
        report["latency_ratio"] = {
            str(b): _ratio(teacher.latency_ms.get(b), student.latency_ms.get(b))
            for b in batch_sizes
        }
    return report


def _cell(value: float | None, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def format_report(report: Mapping[str, Any]) -> str:
    """The report as a plain-text table with the ratios below it."""
    sizes = report["batch_sizes"]
    header = ["model", "parameters", *(f"ms @ batch {b}" for b in sizes), *SCORE_NAMES]
    rows = []
    for name, row in report["models"].items():
        scores = row["scores"] or {}
        rows.append(
            [
                name,
                f"{row['parameters']:,}",
                *(_cell(row["latency_ms"][str(b)], ".1f") for b in sizes),
                *(_cell(scores.get(s), ".4f") for s in SCORE_NAMES),
            ]
        )
    text = [render_table(header, rows, width=140)]  # wide enough for every score's full name
    if "parameter_ratio" in report:
        latency = ", ".join(
            f"batch {b}: {_cell(report['latency_ratio'][str(b)], '.2f')}×" for b in sizes
        )
        text.append(
            f"teacher/student: parameters {_cell(report['parameter_ratio'], '.2f')}×, "
            f"latency {latency} (on {report['device']})"
        )
    return "\n".join(text)
