"""A Hydra callback that ends every multirun with a table of its jobs and names the best.

Each job writes `job_result.json` into its own folder when it ends (overrides, status, the
optimized metric or the error), so the record survives whatever launcher ran the job (another
process, a SLURM node). When the sweep ends, the callback reads every job's record from the sweep
folder, prints one table (overrides, metric, status, folder) with the best job named by the task's
`monitor_mode`, and writes it as `multirun_summary.json` beside the jobs. Failed jobs are listed
with their error, not lost.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any

from hydra.core.utils import JobReturn, JobStatus
from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from vramkit.core.compat import hydra_private
from vramkit.core.io.checkpoint_io import atomic_write_bytes
from vramkit.core.tables import render_table

log = logging.getLogger(__name__)

JOB_RESULT = "job_result.json"
SUMMARY = "multirun_summary.json"


def job_result(job_return: JobReturn, output_dir: str) -> dict[str, Any]:
    """What one job leaves for the summary: overrides, status, metric or error, folder."""
    record: dict[str, Any] = {
        "overrides": list(job_return.overrides or []),
        "folder": output_dir,
        "status": "completed" if job_return.status == JobStatus.COMPLETED else "failed",
        "metric": None,
        "error": None,
    }
    value = hydra_private.job_outcome(job_return)
    if record["status"] == "failed":
        record["error"] = f"{type(value).__name__}: {value}"
    elif isinstance(value, (int, float)) and math.isfinite(value):
        record["metric"] = float(value)
    return record


def summarize(records: list[dict[str, Any]], mode: str) -> dict[str, Any]:
    """The jobs in order, and the best one by `mode` ("max" or "min") among those with a metric."""
    scored = [record for record in records if record["metric"] is not None]
    best = None
    if scored:
        pick = max if mode == "max" else min
        best = pick(scored, key=lambda record: record["metric"])
    failed = [record for record in records if record["status"] == "failed"]
    return {"jobs": records, "best": best, "failed": len(failed), "monitor_mode": mode}


class MultirunSummary(Callback):
    """Hydra callback: records each job's result; at the end of a sweep, the table and the best."""

    def on_job_end(self, config: DictConfig, job_return: JobReturn, **kwargs: Any) -> None:
        """Write the job's `job_result.json` into its output folder."""
        output_dir = config.hydra.runtime.output_dir
        record = job_result(job_return, output_dir)
        atomic_write_bytes(Path(output_dir) / JOB_RESULT, json.dumps(record, indent=2).encode())

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        """Print the sweep's table, name the best job, and write `multirun_summary.json`."""
        sweep_dir = Path(config.hydra.sweep.dir)
        paths = sorted(sweep_dir.glob(f"*/{JOB_RESULT}"), key=lambda p: _job_number(p.parent))
        records = [json.loads(path.read_text()) for path in paths]
        if not records:
            return
        metric = config.get("optimized_metric") or "metric"
        summary = summarize(records, str(config.get("monitor_mode") or "max"))
        summary["optimized_metric"] = metric
        atomic_write_bytes(sweep_dir / SUMMARY, json.dumps(summary, indent=2).encode())
        # Overrides every job shares (the command line) say nothing about which job is which.
        shared = set.intersection(*(set(record["overrides"]) for record in records))
        rows = [
            [
                Path(record["folder"]).name,
                " ".join(o for o in record["overrides"] if o not in shared) or "(the same)",
                "-" if record["metric"] is None else f"{record['metric']:.4f}",
                record["status"] if record["error"] is None else record["error"][:60],
            ]
            for record in records
        ]
        table = render_table(["job", "overrides", metric, "status"], rows, left=["overrides"])
        log.info("Multirun summary\n%s", table)
        best = summary["best"]
        if best is None:
            log.warning("no job reported %s (%d failed): %s", metric, summary["failed"], sweep_dir)
            return
        log.info(
            "best job: %s with %s = %.4f (%s); %d of %d failed",
            best["folder"],
            metric,
            best["metric"],
            " ".join(o for o in best["overrides"] if o not in shared) or "the shared overrides",
            summary["failed"],
            len(records),
        )


def _job_number(folder: Path) -> int:
    return int(folder.name) if folder.name.isdigit() else -1
