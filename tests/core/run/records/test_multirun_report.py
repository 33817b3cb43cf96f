"""The multirun report: jobs grouped by condition, mean ± sample std over seeds, failures."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from vramkit.core.run.records.multirun_report import REPORT, render_report, report_multirun
from vramkit.multirun_report import main


def _job(sweep: Path, number: int, overrides: list[str], rows: list[dict], status="completed"):
    folder = sweep / str(number)
    folder.mkdir(parents=True)
    record = {"overrides": overrides, "folder": str(folder), "status": status}
    (folder / "job_result.json").write_text(json.dumps(record))
    if rows:
        log = folder / "csv" / "version_0"
        log.mkdir(parents=True)
        names = sorted({name for row in rows for name in row})
        lines = [",".join(names)] + [",".join(str(row.get(n, "")) for n in names) for row in rows]
        (log / "metrics.csv").write_text("\n".join(lines) + "\n")


@pytest.fixture
def sweep(tmp_path: Path) -> Path:
    shared = ["experiment=x"]
    for number, (condition, seed, accuracy) in enumerate(
        [("a", 0, 0.5), ("a", 1, 0.7), ("b", 0, 0.9), ("b", 1, None)]
    ):
        rows = [{"epoch": 0, "val/accuracy": 0.1, "train/loss": 3.0}]  # an earlier epoch
        if accuracy is not None:
            rows.append({"epoch": 1, "val/accuracy": accuracy})
        _job(
            tmp_path,
            number,
            [f"condition={condition}", f"seed={seed}", *shared],
            rows if accuracy is not None else [],
            status="completed" if accuracy is not None else "failed",
        )
    return tmp_path


def test_conditions_are_grouped_across_seeds_from_the_last_logged_values(sweep):
    report = report_multirun(sweep)
    assert report["metrics"] == ["val/accuracy"]  # every val/ metric by default
    a, b = report["conditions"]
    assert (a["condition"], b["condition"]) == ("condition=a", "condition=b")
    stats = a["metrics"]["val/accuracy"]
    assert stats["mean"] == pytest.approx(0.6) and stats["n"] == 2
    assert stats["std"] == pytest.approx(statistics.stdev([0.5, 0.7]))
    assert b["failed"] == 1 and b["metrics"]["val/accuracy"]["n"] == 1
    assert "0.6000 ± 0.1414 (2)" in render_report(report)


def test_the_command_writes_the_report_and_refuses_a_folder_without_jobs(sweep, tmp_path, capsys):
    assert main([str(sweep), "--metrics", "val/accuracy", "train/loss"]) == 0
    written = json.loads((sweep / REPORT).read_text())
    assert written["conditions"][0]["metrics"]["train/loss"]["mean"] == 3.0
    assert main([str(tmp_path / "empty")]) == 2
    assert "no job_result.json" in capsys.readouterr().err
