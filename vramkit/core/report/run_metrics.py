"""A run's logged metrics, read back from the CSV logger's ``metrics.csv``."""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Series:
    """One metric's values in the order they were logged, with the step and epoch of each."""

    name: str
    steps: list[int] = field(default_factory=list)
    epochs: list[int] = field(default_factory=list)
    values: list[float] = field(default_factory=list)

    @property
    def per_epoch(self) -> bool:
        """True when the metric was logged at most once per epoch (validation, phase peaks)."""
        return len(set(self.epochs)) == len(self.epochs) and not self.name.startswith("lr-")

    def last(self) -> float:
        return self.values[-1]


def find_metrics_csv(run_dir: Path) -> Path | None:
    """The newest ``metrics.csv`` of the run: the CSV logger's ``<name>/version_N/metrics.csv``."""
    candidates = [*run_dir.glob("*/version_*/metrics.csv"), *run_dir.glob("metrics.csv")]
    if not candidates:
        return None
    return max(candidates, key=lambda path: (path.stat().st_mtime, str(path)))


def read_metrics(path: Path) -> dict[str, Series]:
    """Every metric column of a CSV logger's file, as series (empty cells are skipped).

    Rows without an ``epoch`` value (Lightning's LearningRateMonitor logs only the step) take
    the epoch of the nearest earlier row, so every value has both.
    """
    series: dict[str, Series] = {}
    epoch = 0
    with path.open(newline="") as handle:
        for row in csv.DictReader(handle):
            step = _number(row.get("step"))
            if _number(row.get("epoch")) is not None:
                epoch = int(_number(row["epoch"]))  # type: ignore[arg-type]
            for name, cell in row.items():
                value = _number(cell)
                if name in ("step", "epoch") or value is None:
                    continue
                entry = series.setdefault(name, Series(name))
                entry.steps.append(int(step) if step is not None else len(entry.steps))
                entry.epochs.append(epoch)
                entry.values.append(value)
    return series


def _number(cell: str | None) -> float | None:
    if cell is None or cell == "":
        return None
    try:
        value = float(cell)
    except ValueError:
        return None
    return value if math.isfinite(value) else None
