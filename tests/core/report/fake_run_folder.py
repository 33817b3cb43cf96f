"""A run folder as a fit leaves it, written by hand: metrics.csv, config, plan, a task picture."""

from __future__ import annotations

import json
from pathlib import Path

from matplotlib.figure import Figure

from vramkit.core.report.task_figures import ReportFigure, save_task_figure

# The CSV logger's layout: one row per logging call, empty cells for the other metrics; the
# LearningRateMonitor's rows have no epoch.
HEADER = (
    "epoch,lr-AdamW,mem/train_peak_gib,mem/val_peak_gib,perf/train_samples_per_s,step,"
    "train/loss,val/hmean"
)
ROWS = [
    ",0.001,,,,0,,",
    "0,,,,,0,2.0,",
    ",0.002,,,,1,,",
    "0,,,,30.0,1,1.5,",
    "0,,1.25,1.5,,1,,0.25",
    ",0.003,,,,2,,",
    "1,,,,,2,1.0,",
    ",0.004,,,,3,,",
    "1,,,,33.0,3,0.5,",
    "1,,1.3,1.55,,3,,0.75",
]
MEASURED_PEAKS = {"train": 1.3, "val": 1.55}
# peak_gib counts the CUDA context too; the measured allocator peak compares with max_allocated
PLAN = {
    "train": {"batch_size": 8, "peak_gib": 1.9, "max_allocated_gib": 1.4},
    "val": {"batch_size": 16, "peak_gib": 2.0, "max_allocated_gib": 1.5},
}


def write_fake_run(run_dir: Path, *, plan: bool = True, task_picture: bool = True) -> Path:
    metrics = run_dir / "csv" / "version_0" / "metrics.csv"
    metrics.parent.mkdir(parents=True)
    metrics.write_text("\n".join([HEADER, *ROWS]) + "\n")
    (run_dir / "resolved_config.yaml").write_text(
        "task_name: fake_task\noptimized_metric: val/hmean\nmonitor_mode: max\n"
        "hw:\n  name: t4\n  accelerator: gpu\n  precision: 16-mixed\n"
    )
    if plan:
        (run_dir / "memory_plan.json").write_text(json.dumps({**PLAN, "budget_gib": 2.5}))
    if task_picture:
        figure = Figure(figsize=(2, 2))
        figure.subplots().imshow([[0, 1], [1, 0]])
        save_task_figure(
            ReportFigure("checker", "A checker board", figure, "two by two"), run_dir / "report"
        )
    return run_dir
