"""The benchmarks' own logic: the all-pairs reference, the result files, the summary, the CSV
reader, and a tiny run of the overhead comparison (both sides take the same steps)."""

from __future__ import annotations

import json
import math
import mmap
from pathlib import Path

import numpy as np
import pytest

from benchmarks import evaluation, overhead, record, run_all
from benchmarks.data_pipeline import measure_in_process
from benchmarks.record import machine_facts, write_result
from benchmarks.validation_ratio import last_logged
from vramkit.tasks.text_detection.data.augment import build_train_transform
from vramkit.tasks.text_detection.data.icdar_folder import TextDetectionDataset


def test_evaluation_benchmark_agrees_with_the_script_replay_and_reports_speedup() -> None:
    pytest.importorskip("Polygon", reason="the script replay needs Polygon3 (dev extra)")
    numbers = evaluation.run(images=2, gt_count=30, det_count=30, seed=3, repeats=1)
    assert numbers["identical_results"] is True
    assert numbers["metrics"]["gt_care"] > 0 and numbers["metrics"]["matched"] > 0
    # speedup is rounded to 0.1: allow that on a ratio near 1 for this tiny run.
    assert numbers["speedup"] == pytest.approx(
        numbers["reference_seconds"] / numbers["vramkit_seconds"], rel=0.05, abs=0.1
    )


def test_generated_scene_is_integer_clockwise_with_degenerate_quads() -> None:
    gt, texts, detections = evaluation.make_scene(np.random.default_rng(0), 100, 100)
    assert len(gt) == len(texts) == len(detections) == 100
    assert 2 < sum(text in evaluation.DONT_CARE_SPELLINGS for text in texts) < 30
    for quad in gt + detections:
        x, y = quad[:, 0], quad[:, 1]
        assert quad.dtype == np.int64
        assert ((np.roll(x, -1) - x) * (np.roll(y, -1) + y)).sum() <= 0
    assert np.array_equal(gt[1][1], gt[1][2])  # a zero-area quad


def test_in_process_throughput_counts_real_samples(toy_icdar_dir: Path) -> None:
    dataset = TextDetectionDataset(
        toy_icdar_dir, build_train_transform(128), target_params={"shrink_ratio": 0.4}
    )
    numbers = measure_in_process(dataset, samples=4)
    assert numbers["samples"] == 4
    assert numbers["cpu_seconds"] > 0
    assert numbers["samples_per_core_s"] == pytest.approx(4 / numbers["cpu_seconds"], rel=0.05)


def test_result_file_holds_command_machine_and_numbers(tmp_path: Path) -> None:
    path = write_result("example", {"speedup": 3.0}, started=0.0, directory=tmp_path)
    result = json.loads(path.read_text())
    assert path == tmp_path / "example.json"
    assert result["benchmark"] == "example"
    assert result["results"] == {"speedup": 3.0}
    assert result["command"].startswith("python")
    facts = machine_facts()
    assert result["machine"]["torch"] == facts["torch"]
    assert facts["usable_cores"] >= 1
    assert set(facts["cpu_features"]) <= set(record.SPEED_FEATURES)
    steal = facts["cpu_steal_fraction"]
    assert steal is None or 0.0 <= steal <= 1.0


def test_last_logged_takes_the_last_non_empty_value(tmp_path: Path) -> None:
    metrics = tmp_path / "metrics.csv"
    metrics.write_text(
        "epoch,perf/val_train_time_ratio,step,val/hmean\n0,2.5,10,\n0,,11,0.4\n1,1.25,20,\n1,,21,\n"
    )
    assert last_logged(metrics, ["perf/val_train_time_ratio", "val/hmean", "absent"]) == {
        "perf/val_train_time_ratio": 1.25,
        "val/hmean": 0.4,
    }


def test_summary_table_marks_missed_targets() -> None:
    assert run_all._headline("evaluation", {"speedup": 31.0, "target_speedup": 20})[2]
    assert not run_all._headline("overhead", {"overhead_pct": 7.5, "target_overhead_pct": 5.0})[2]
    value, _, met = run_all._headline(
        "data_pipeline",
        {
            "target_samples_per_core_s": 40.0,
            "synthetic": {"samples_per_core_s": 55.0, "loader_samples_per_core_s": 41.0},
            "icdar2015_toy": {"samples_per_core_s": 39.0, "loader_samples_per_core_s": 30.0},
        },
    )
    assert not met and "synthetic 55.0/s (41.0 loader)" in value
    with pytest.raises(SystemExit):
        run_all.main(["no_such_benchmark"])


def test_overhead_counts_the_page_faults_of_steady_steps() -> None:
    # the first 3 steps are start-up; then steps of 100 and 40 faults: median 70
    assert overhead.steady_step_faults([0, 5000, 9000, 9100, 9200, 9240]) == 70
    assert math.isnan(overhead.steady_step_faults([0, 1, 2, 3]))
    # A fresh anonymous mapping, one byte written per page: each write maps a page in. (A
    # bytearray may reuse pages this process already holds, or be calloc'ed untouched.)
    pages = 256
    with mmap.mmap(-1, pages * mmap.PAGESIZE) as fresh:
        before = overhead.minor_faults()
        for page in range(pages):
            fresh[page * mmap.PAGESIZE] = 1
        assert overhead.minor_faults() >= before + pages // 2


@pytest.mark.slow
def test_overhead_sides_take_the_same_steps(tmp_path: Path) -> None:
    numbers = overhead.run(
        repeats=1,
        epochs=1,
        extra_overrides=(
            f"paths.data_dir={tmp_path}",
            "data.synthetic.num_train=32",
            "data.synthetic.image_size=64",
            "data.image_size=64",
            "data.val_image_size=64",
            "trainer.log_every_n_steps=1",
        ),
    )
    assert numbers["steps"] == 2
    assert min(numbers[f"{side}_seconds"] for side in ("plain", "lightning", "vramkit")) > 0
    assert set(numbers["all_runs"]) == {"plain", "lightning", "vramkit"}
    (plain,) = numbers["all_runs"]["plain"]
    assert all(plain[phase] >= 0 for phase in ("setup_seconds", "steps_seconds"))
    phases = sum(plain[p] for p in ("setup_seconds", "steps_seconds", "closing_seconds"))
    assert phases == pytest.approx(plain["cpu_seconds"], abs=0.002)  # rounded to ms each
    assert math.isnan(plain["steady_step_faults"])  # 2 steps: none is steady
    assert set(numbers["phase_overhead_seconds"]) == {
        "setup_seconds",
        "steps_seconds",
        "closing_seconds",
    }
