"""The benchmarks' own logic: the all-pairs reference, the result files, the summary, the CSV
reader, and a tiny run of the overhead comparison (both sides take the same steps)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from benchmarks import evaluation, overhead, run_all
from benchmarks.data_pipeline import measure_in_process
from benchmarks.record import machine_facts, write_result
from benchmarks.validation_ratio import last_logged
from vramkit.tasks.text_detection.augment import build_train_transform
from vramkit.tasks.text_detection.icdar_eval import ImageCounts
from vramkit.tasks.text_detection.icdar_folder import TextDetectionDataset


def _box(x0: float, y0: float, x1: float, y1: float) -> np.ndarray:
    return np.array([[x0, y0], [x1, y0], [x1, y1], [x0, y1]], dtype=np.float64)


def test_all_pairs_reference_follows_the_protocol() -> None:
    gt = [_box(0, 0, 10, 10), _box(20, 0, 30, 10), _box(50, 0, 70, 20), _box(0, 40, 10, 50)]
    ignore = [False, False, True, False]
    bow_tie = np.array([[0, 40], [10, 50], [10, 40], [0, 50]], dtype=np.float64)
    detections = [
        _box(0, 0, 10, 10),  # exact match of gt 0
        _box(1, 0, 11, 10),  # IoU 9/11 with gt 0, which is taken: a false positive
        _box(26, 0, 36, 10),  # IoU 4/16 with gt 1: no match
        _box(52, 2, 62, 12),  # inside the ### region: not counted
        bow_tie,  # self-intersecting: skipped
    ]
    counts = evaluation.all_pairs_match(gt, ignore, detections)
    assert counts == ImageCounts(matched=1, gt_care=3, det_care=3, invalid_gt=0, invalid_det=1)


def test_evaluation_benchmark_agrees_with_the_reference_and_reports_speedup() -> None:
    numbers = evaluation.run(images=1, gt_count=60, det_count=60, seed=3)
    assert numbers["identical_results"] is True
    assert numbers["metrics"]["gt_care"] > 0 and numbers["metrics"]["matched"] > 0
    assert numbers["metrics"]["invalid_gt"] > 0 and numbers["metrics"]["invalid_det"] > 0
    assert numbers["speedup"] == pytest.approx(
        numbers["all_pairs_seconds"] / numbers["vramkit_seconds"], rel=0.05
    )


def test_generated_scene_has_the_requested_sizes() -> None:
    gt, ignore, detections = evaluation.make_scene(np.random.default_rng(0), 300, 300)
    assert len(gt) == len(ignore) == len(detections) == 300
    assert 10 < sum(ignore) < 60
    assert all(np.array_equal(quad, np.round(quad)) for quad in gt + detections)


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
    assert numbers["plain_seconds"] > 0 and numbers["vramkit_seconds"] > 0
