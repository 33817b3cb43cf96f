"""The eval-batch benchmark: its rounds and summary without planning, and docs/planner.md's
table and `hw: inference plan` line against the committed result file."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from benchmarks import eval_batch_plan, run_all

ROOT = Path(__file__).resolve().parents[2]
RESULT = ROOT / "benchmarks" / "results" / "eval_batch_plan.json"
PLANNER_DOC = ROOT / "docs" / "planner.md"


def _fake_plans(calls: list[tuple], seconds: dict[str, list[float]]):
    """A `plan_in_child` stand-in: the same plan each time, `seconds[kind]` in turn."""
    left = {kind: iter(values) for kind, values in seconds.items()}

    def plan(case, kind, data_dir):
        calls.append((case, kind))
        traces = 1 if kind == "inference" else 5
        return {
            "eval_batch": 9,
            "planned_peak_gib": 6.1,
            "budget_gib": 6.63,
            "traces": traces,
            "seconds": next(left[kind]) if calls[1:] else 99.0,  # the first, untimed, renders
        }

    return plan


def test_rounds_alternate_the_two_plans_and_keep_every_time(monkeypatch, tmp_path):
    monkeypatch.setattr(eval_batch_plan, "CASES", eval_batch_plan.CASES[:1])
    calls: list[tuple] = []
    plan = _fake_plans(calls, {"inference": [1.0, 3.0, 2.0], "full": [5.0, 4.0, 6.5]})
    (result,) = eval_batch_plan.measure(3, tmp_path, plan)
    case = eval_batch_plan.CASES[0]
    kinds = [kind for _, kind in calls]
    # One untimed plan first, then the order flips every round.
    assert kinds == ["inference", "inference", "full", "full", "inference", "inference", "full"]
    assert all(called == case for called, _ in calls)
    assert result["case"] == "dbnet_tiny, 320 px, t4"
    assert (result["eval_batch"], result["planned_peak_gib"], result["budget_gib"]) == (
        9,
        6.1,
        6.63,
    )
    assert result["inference"] == {
        "traces": 1,
        "seconds": [1.0, 3.0, 2.0],
        "median_s": 2.0,
        "min_s": 1.0,
        "max_s": 3.0,
    }
    assert result["full"]["median_s"] == 5.0 and result["full"]["traces"] == 5
    assert eval_batch_plan.table_row(result) == (
        "| dbnet_tiny, 320 px, t4 | 9 (6.10 of 6.63 GiB) | 2.0 s (1.0–3.0), 1 trace "
        "| 5.0 s (4.0–6.5), 5 traces |"
    )


def test_an_inference_plan_that_changes_between_runs_is_an_error():
    case = eval_batch_plan.CASES[0]
    run = {"eval_batch": 9, "planned_peak_gib": 6.1, "budget_gib": 6.6, "traces": 3, "seconds": 1}
    runs = {"inference": [run, {**run, "eval_batch": 8}], "full": [run, run]}
    with pytest.raises(RuntimeError, match="differs between runs"):
        eval_batch_plan.summarise(case, runs)


def test_make_bench_headline_needs_the_same_batch_and_a_faster_inference_plan():
    case = {
        "eval_batch": 9,
        "full_plan_eval_batch": 9,
        "inference": {"median_s": 0.8},
        "full": {"median_s": 2.4},
    }
    value, _, met = run_all._headline("eval_batch_plan", {"cases": [case, case]})
    assert met and "2/2" in value and "3.0x" in value
    _, _, met = run_all._headline(
        "eval_batch_plan", {"cases": [case, {**case, "full_plan_eval_batch": 8}]}
    )
    assert not met


def _committed_cases() -> list[dict]:
    return json.loads(RESULT.read_text())["results"]["cases"]


def test_the_committed_result_has_every_case_and_agrees_with_the_full_plan():
    cases = _committed_cases()
    assert [case["case"] for case in cases] == [case.name for case in eval_batch_plan.CASES]
    for case in cases:
        assert case["eval_batch"] == case["full_plan_eval_batch"], case["case"]
        assert case["planned_peak_gib"] <= case["budget_gib"], case["case"]


def _cells(row: str) -> list[str]:
    return [cell.strip() for cell in row.strip("| ").split(" | ")]


def _traces(cell: str) -> str:
    return cell.rsplit(", ", 1)[1]


def test_docs_planner_table_quotes_the_committed_result():
    # Batch, peak and traces are the plan's and must match; times vary from run to run.
    rows = {
        _cells(line)[0]: _cells(line)
        for line in PLANNER_DOC.read_text().splitlines()
        if line.startswith("| dbnet_")
    }
    for case in _committed_cases():
        quoted, measured = rows.get(case["case"]), _cells(eval_batch_plan.table_row(case))
        assert quoted is not None, case["case"]
        assert quoted[1] == measured[1], case["case"]
        assert [_traces(cell) for cell in quoted[2:]] == [_traces(c) for c in measured[2:]]


def test_docs_inference_plan_line_quotes_the_committed_result():
    (line,) = [
        line
        for line in PLANNER_DOC.read_text().splitlines()
        if line.startswith("hw: inference plan (")
    ]
    found = re.fullmatch(
        r"hw: inference plan \((\w+), 16-mixed\): eval batch (\d+) \(the largest that fits\), "
        r"planned peak ([\d.]+) GiB of budget ([\d.]+) GiB; (\d+) inference traces in [\d.]+ s",
        line,
    )
    assert found, line
    profile, batch, peak, budget, traces = found.groups()
    (case,) = [
        case
        for case in _committed_cases()
        if case["profile"] == profile and case["val_image_size"] == 1280
    ]
    assert int(batch) == case["eval_batch"]
    assert float(peak) == case["planned_peak_gib"] and float(budget) == case["budget_gib"]
    assert int(traces) == case["inference"]["traces"]
