"""Per-condition means of a multirun's metrics, with their spread over seeds (or any other key).

A sweep such as ``condition=a,b seed=0,1,2`` runs every condition several times. This report
reads each job's folder (listed by its ``job_result.json``, see
:mod:`vramkit.core.run.records.multirun_summary`), takes the last logged value of each metric from
the
job's CSV log (``csv/version_*/metrics.csv``, the last validation of the run, not the best
checkpoint's), groups the jobs whose overrides differ only in the ``across`` key, and reports
for every group and metric the mean, the sample standard deviation (n − 1) and the number of
jobs. Failed jobs and jobs without the metric are counted, not averaged.
"""

from __future__ import annotations

import csv
import json
import math
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from vramkit.core.io.checkpoint_io import atomic_write_bytes
from vramkit.core.run.records.multirun_summary import JOB_RESULT
from vramkit.core.tables import render_table

REPORT = "multirun_report.json"


def last_logged_values(job_folder: Path) -> dict[str, float]:
    """The last non-empty value of every column of the job's newest CSV log ({} without one)."""
    logs = sorted(
        Path(job_folder).glob("csv/version_*/metrics.csv"),
        key=lambda path: int(path.parent.name.removeprefix("version_") or 0),
    )
    if not logs:
        return {}
    values: dict[str, float] = {}
    with logs[-1].open(newline="", encoding="utf-8") as file:
        for row in csv.DictReader(file):
            for name, cell in row.items():
                if cell not in (None, "") and name not in ("epoch", "step"):
                    values[name] = float(cell)
    return values


def _condition(overrides: Sequence[str], across: str) -> str:
    kept = [o for o in overrides if o.split("=", 1)[0].lstrip("+~") != across]
    return " ".join(kept) or "(no overrides)"


def _statistics(values: list[float]) -> dict[str, Any]:
    if not values:
        return {"mean": None, "std": None, "n": 0}
    spread = statistics.stdev(values) if len(values) > 1 else 0.0
    return {"mean": statistics.fmean(values), "std": spread, "n": len(values)}


def report_multirun(
    sweep_dir: Path, *, metrics: Sequence[str] | None = None, across: str = "seed"
) -> dict[str, Any]:
    """The report of ``sweep_dir``: ``{"across", "metrics", "conditions": [{"condition",
    "jobs", "failed", "metrics": {name: {"mean", "std", "n"}}}]}``, conditions in job order.

    ``metrics`` defaults to every ``val/`` metric any job logged.
    """
    paths = sorted(
        Path(sweep_dir).glob(f"*/{JOB_RESULT}"),
        key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else -1,
    )
    if not paths:
        raise FileNotFoundError(f"no {JOB_RESULT} below {sweep_dir}: is it a multirun folder?")
    records = [json.loads(path.read_text()) for path in paths]
    for record, path in zip(records, paths, strict=True):
        record["values"] = last_logged_values(path.parent)
    # Overrides every job shares (the command line) do not tell conditions apart.
    shared = set.intersection(*(set(record["overrides"]) for record in records))
    if metrics is None:
        metrics = sorted({name for r in records for name in r["values"] if name.startswith("val/")})
    groups: dict[str, list[dict[str, Any]]] = {}
    for record in records:
        own = [o for o in record["overrides"] if o not in shared]
        groups.setdefault(_condition(own, across), []).append(record)
    conditions = []
    for condition, jobs in groups.items():
        completed = [job for job in jobs if job["status"] == "completed"]
        conditions.append(
            {
                "condition": condition,
                "jobs": len(jobs),
                "failed": len(jobs) - len(completed),
                "metrics": {
                    name: _statistics(
                        [
                            job["values"][name]
                            for job in completed
                            if name in job["values"] and math.isfinite(job["values"][name])
                        ]
                    )
                    for name in metrics
                },
            }
        )
    return {
        "sweep_dir": str(sweep_dir),
        "across": across,
        "metrics": list(metrics),
        "conditions": conditions,
    }


def render_report(report: dict[str, Any]) -> str:
    """The report as a table: one row per condition, ``mean ± std (n)`` per metric."""

    def cell(stats: dict[str, Any]) -> str:
        if stats["mean"] is None:
            return "-"
        return f"{stats['mean']:.4f} ± {stats['std']:.4f} ({stats['n']})"

    rows = [
        [c["condition"], *(cell(c["metrics"][m]) for m in report["metrics"]), str(c["failed"])]
        for c in report["conditions"]
    ]
    return render_table(
        ["condition", *report["metrics"], "failed"],
        rows,
        title=f"mean ± sample std over {report['across']} (jobs)",
        caption="last validation of each job",
        width=160,
    )


def write_report(report: dict[str, Any], sweep_dir: Path) -> Path:
    """Write ``multirun_report.json`` beside the jobs; return its path."""
    path = Path(sweep_dir) / REPORT
    atomic_write_bytes(path, json.dumps(report, indent=2).encode())
    return path
