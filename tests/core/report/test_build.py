"""report.html from a run folder: every section, and pictures that hold what was logged."""

from __future__ import annotations

import re

import numpy as np
import pytest
from fake_run_folder import MEASURED_PEAKS, PLAN, write_fake_run
from matplotlib.image import imread

from vramkit.core.report import build_report


def _images(html: str) -> list[str]:
    return re.findall(r'<img src="([^"]+)"', html)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """A fake run folder and its report (drawn once: a report takes 1-2 s of matplotlib)."""
    run = write_fake_run(tmp_path_factory.mktemp("report") / "run")
    return run, build_report(run).read_text()


def test_report_has_every_section_and_its_pictures(built):
    run, html = built
    headings = re.findall(r"<h2>([^<]+)</h2>", html)
    assert headings == [
        "Run",
        "Loss",
        "Validation metrics",
        "Learning rate",
        "Throughput and step time",
        "Memory per phase over time",
        "Planned and measured peak memory",
        "Task pictures",
    ]
    assert _images(html) == [
        "report/loss.png",
        "report/val_metrics.png",
        "report/learning_rate.png",
        "report/throughput.png",
        "report/memory.png",
        "report/memory_plan.png",
        "report/task_checker.png",
    ]
    for relative in _images(html):
        pixels = imread(run / relative)
        # a drawn chart, not a blank canvas: many distinct colours
        assert pixels.shape[0] > 100 and pixels.shape[1] > 100
        assert len(np.unique(pixels[::4, ::4].reshape(-1, pixels.shape[-1]), axis=0)) > 10
    assert "A checker board: two by two" in html
    assert "val/hmean (optimized): last 0.75, best 0.75" in html


def test_memory_section_sets_the_prediction_beside_the_measured_peak(built):
    _, html = built
    for phase in ("train", "val"):
        predicted, measured = PLAN[phase]["max_allocated_gib"], MEASURED_PEAKS[phase]
        error = predicted / measured - 1
        assert (
            f"{phase}: predicted {predicted:.3f} GiB, measured {measured:.3f} GiB ({error:+.1%})"
            in html
        )


def test_a_run_without_plan_or_task_pictures_says_so(tmp_path):
    run = write_fake_run(tmp_path / "run", plan=False, task_picture=False)
    html = build_report(run).read_text()
    assert "no planner prediction" in html
    assert "report_figures" in html  # how a task would add its pictures
    assert "report/memory_plan.png" in _images(html)  # the measured peaks are still drawn


def test_a_folder_without_metrics_gets_a_report_that_says_what_is_missing(tmp_path):
    html = build_report(tmp_path).read_text()
    assert "no metrics.csv found" in html
    assert "nothing logged for this section" in html
    assert _images(html) == []
    assert not (tmp_path / "report").exists()  # no picture, no folder for pictures


def test_the_logs_planned_peak_is_in_the_report_beside_the_allocator_prediction(built):
    _, html = built
    for phase in ("train", "val"):
        peak, allocated = PLAN[phase]["peak_gib"], PLAN[phase]["max_allocated_gib"]
        assert (
            f"{phase}: planned peak {peak:.2f} GiB, the number the run log prints and the budget "
            f"counts (max allocated {allocated:.3f} GiB"
        ) in html
