"""Pictures that say what their titles say: each panel draws its own series, amounts from 0,
the planner's peaks beside the measured ones."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from matplotlib.figure import Figure

from vramkit.core.report import build
from vramkit.core.report.curves import Panel, draw_panel
from vramkit.core.report.run_metrics import Series

THROUGHPUT = [
    "perf/train_samples_per_s",
    "perf/train_step_ms_median",
    "perf/data_wait_fraction",
    "perf/val_samples_per_s",
    "perf/val_train_time_ratio",
]


def _run(tmp_path: Path, metrics: list[str], *, accelerator: str, plan: dict | None) -> Path:
    """A run folder whose metrics.csv logs `metrics` once per epoch for two epochs."""
    rows = ["epoch,step," + ",".join(metrics)]
    rows += [
        f"{epoch},{epoch},{','.join(f'{1.0 + epoch / 50:.3f}' for _ in metrics)}"
        for epoch in (0, 1)
    ]
    csv = tmp_path / "csv" / "version_0" / "metrics.csv"
    csv.parent.mkdir(parents=True)
    csv.write_text("\n".join(rows) + "\n")
    (tmp_path / "resolved_config.yaml").write_text(f"hw:\n  accelerator: {accelerator}\n")
    if plan is not None:
        (tmp_path / build.MEMORY_PLAN).write_text(json.dumps(plan))
    return tmp_path


@pytest.fixture
def drawn(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[Panel]]:
    """The panels each picture would draw, by file name (nothing is drawn)."""
    pictures: dict[str, list[Panel]] = {}

    def capture(path: Path, panels: list[Panel], **_: object) -> Path:
        pictures[path.name] = list(panels)
        return path

    monkeypatch.setattr(build, "plot_series", capture)
    return pictures


def test_without_mfu_no_panel_promises_it_and_each_panel_draws_its_own_series(tmp_path, drawn):
    build._curve_sections(_run(tmp_path, THROUGHPUT, accelerator="cpu", plan=None), _read(tmp_path))
    panels = drawn["throughput.png"]
    assert [panel.title for panel in panels] == [
        "training samples/s",
        "validation samples/s",
        "training step time (ms)",
        "share of step time waiting for data",
        "val/train time per sample",
    ]
    assert [[s.name for s in panel.series] for panel in panels] == [
        [name]
        for name in (
            "perf/train_samples_per_s",
            "perf/val_samples_per_s",
            "perf/train_step_ms_median",
            "perf/data_wait_fraction",
            "perf/val_train_time_ratio",
        )
    ]
    assert all(panel.from_zero for panel in panels)


def test_a_logged_mfu_gets_its_panel(tmp_path, drawn):
    run = _run(tmp_path, [*THROUGHPUT, "perf/mfu"], accelerator="gpu", plan=None)
    build._curve_sections(run, _read(run))
    mfu = [panel for panel in drawn["throughput.png"] if "MFU" in panel.title]
    assert [[s.name for s in panel.series] for panel in mfu] == [["perf/mfu"]]


def test_memory_panels_start_at_zero_with_the_plan_beside_the_peaks(tmp_path, drawn):
    plan = {"train": {"peak_gib": 1.9, "max_allocated_gib": 1.4}, "val": {"peak_gib": 1.2}}
    memory = ["mem/train_peak_gib", "mem/val_peak_gib", "mem/train_reserved_gib"]
    run = _run(tmp_path, memory, accelerator="gpu", plan=plan)
    build._curve_sections(run, _read(run))
    peak, reserved = drawn["memory.png"]
    assert peak.title == "peak allocated (GiB)"
    assert reserved.title == "peak reserved by the caching allocator (GiB)"
    assert peak.from_zero and reserved.from_zero
    # what mem/<phase>_peak_gib reads on a GPU: the allocator's peak, not the peak with context
    assert dict(peak.planned) == {"mem/train_peak_gib": 1.4, "mem/val_peak_gib": 1.2}


def test_on_a_cpu_the_memory_titles_say_main_process(tmp_path, drawn):
    run = _run(tmp_path, ["mem/val_peak_gib", "mem/val_rss_gib"], accelerator="cpu", plan=None)
    build._curve_sections(run, _read(run))
    assert [panel.title for panel in drawn["memory.png"]] == [
        "peak resident set, main process (GiB)",
        "resident set at phase end, main process (GiB)",
    ]


def test_a_panel_from_zero_shows_a_two_percent_change_as_two_percent() -> None:
    measured = Series("mem/val_peak_gib", steps=[0, 1], epochs=[0, 1], values=[1.00, 1.02])
    axes = Figure().subplots()
    draw_panel(axes, Panel("peak", [measured], from_zero=True, planned={measured.name: 1.1}))
    low, high = axes.get_ylim()
    assert low == 0 and high >= 1.1
    (line,), (planned,) = axes.get_lines()[:1], axes.get_lines()[1:]
    assert planned.get_linestyle() == "--" and planned.get_color() == line.get_color()
    assert list(planned.get_ydata()) == [1.1, 1.1]


def _read(run: Path) -> dict[str, Series]:
    return build.read_metrics(build.find_metrics_csv(run))
