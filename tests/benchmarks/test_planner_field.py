"""The field benchmark's cases are complete and well-formed; one small case replays end to end."""

from __future__ import annotations

import pytest

from benchmarks import planner_field, run_all

pytest.importorskip("transformers")

CASES = planner_field.load_cases()


def test_there_are_enough_cases_of_each_kind() -> None:
    assert len(CASES) >= 20
    assert len({case["id"] for case in CASES}) == len(CASES)
    assert sum(case["run"]["phase"] == "train" for case in CASES) >= 6
    assert sum((case["run"].get("seq_len") or 0) >= 1024 for case in CASES) >= 3
    assert sum(case.get("oom") is not None for case in CASES) >= 2


@pytest.mark.parametrize("case", CASES, ids=[case["id"] for case in CASES])
def test_every_case_is_complete_and_well_formed(case) -> None:
    assert planner_field.case_problems(case) == []
    path = planner_field.CASES_DIR / f"{case['id']}.json"
    assert path.is_file(), "a case file is named after its id"
    # What a source leaves out is said, never filled in silently.
    for key, value in case["frameworks"].items():
        assert value, f"frameworks.{key}: write 'not stated' rather than nothing"
    if case["gpu"]["memory_gib"] is None:
        assert any("GPU" in item for item in case["not_stated"])
    # The model is rebuilt from the config name and fields alone.
    from vramkit.tasks.hf_models.configs import build_config

    build_config(case["model"]["config"], case["model"]["config_overrides"])


def test_a_case_with_a_problem_is_reported() -> None:
    case = dict(CASES[0], measured=[{"kind": "peak", "value": -1, "unit": "MB"}])
    problems = planner_field.case_problems(case)
    assert any("kind" in p for p in problems) and any("value" in p for p in problems)


def test_one_small_case_replays_end_to_end() -> None:
    case = next(case for case in CASES if case["id"] == "bert_base_mlm_rocm_b2_s16")
    result = planner_field.replay(case)
    kinds = {row["kind"]: row for row in result["comparisons"]}
    assert set(kinds) == {"max_allocated", "max_reserved"}
    assert kinds["max_reserved"]["predicted_gib"] > kinds["max_allocated"]["predicted_gib"]
    for row in kinds.values():
        assert abs(row["error_pct"]) < 50  # a sane replay; the benchmark reports the real error
    summary = planner_field.summarize([result])
    assert summary["allocated"]["count"] == 1
    text = planner_field.table([result], summary)
    assert "bert_base_mlm_rocm_b2_s16" in text and "max_allocated" in text


def test_the_summary_judges_oom_verdicts_and_targets() -> None:
    results = [
        {"comparisons": [{"kind": "max_allocated", "error_pct": 4.0}]},
        {"comparisons": [{"kind": "max_allocated", "error_pct": -30.0}]},
        {
            "comparisons": [{"kind": "oom_lower_bound", "predicted_exceeds": True}],
            "oom_verdict": {"correct": True},
        },
    ]
    summary = planner_field.summarize(results)
    assert summary["allocated"] == {
        "count": 2,
        "median_abs_error_pct": 17.0,
        "worst_abs_error_pct": 30.0,
    }
    assert summary["targets_met"] is False
    assert (summary["oom_cases"], summary["oom_verdicts_correct"]) == (1, 1)
    assert summary["oom_lower_bounds_exceeded"] == 1


def test_run_all_knows_the_field_benchmark() -> None:
    assert "planner_field" in run_all.BENCHMARKS
    value, _, met = run_all._headline(
        "planner_field",
        {
            "allocated": {"median_abs_error_pct": 5.0, "worst_abs_error_pct": 20.0},
            "cases": 21,
            "oom_cases": 4,
            "oom_verdicts_correct": 3,
            "target_median_abs_error_pct": 10.0,
            "target_worst_abs_error_pct": 25.0,
            "targets_met": True,
        },
    )
    assert "5.0%" in value and "OOM 3/4" in value and met is True


def test_a_pinned_release_brings_its_own_dependency_pins() -> None:
    from benchmarks.model_code import _dependency_pins, release_dir

    table = (
        '"tokenizers": "tokenizers>=0.20,<0.21",\n'
        '    "huggingface-hub": "huggingface-hub>=0.23.2,<1.0",'
    )
    assert _dependency_pins(table) == {
        "tokenizers": "tokenizers>=0.20,<0.21",
        "huggingface-hub": "huggingface-hub>=0.23.2,<1.0",
    }
    assert release_dir("4.46.3").name == "transformers-4.46.3"


def test_cases_replayed_with_an_older_release_say_which_and_why() -> None:
    pinned = [case for case in CASES if case["frameworks"].get("replay_transformers")]
    assert pinned, "the OPT and GPT-2 cases replay the release they were measured with"
    for case in pinned:
        assert case["frameworks"]["replay_transformers"].count(".") == 2
        assert case["frameworks"].get("replay_transformers_why")


LLM_CASES = [case for case in CASES if case.get("method")]


def test_the_llm_cases_cover_lora_and_qlora_with_their_settings() -> None:
    assert len(LLM_CASES) >= 14
    methods = [case["method"] for case in LLM_CASES]
    assert methods.count("qlora") >= 6 and methods.count("lora") >= 6
    for case in LLM_CASES:
        llm = case["model"]["llm"]
        assert (llm["quantization"] is not None) == (case["method"] == "qlora"), case["id"]
        assert (llm["lora"] is not None) == (case["method"] in ("lora", "qlora")), case["id"]
        assert "Replica differences" in case["notes"], case["id"]


def test_llm_errors_are_reported_signed_per_method() -> None:
    results = [
        {"method": "lora", "comparisons": [{"kind": "max_allocated", "error_pct": -4.0}]},
        {"method": "qlora", "comparisons": [{"kind": "max_allocated", "error_pct": -8.5}]},
        {"method": "qlora", "comparisons": [{"kind": "max_allocated", "error_pct": 3.0}]},
        {"comparisons": [{"kind": "max_allocated", "error_pct": -30.0}]},  # not an LLM case
    ]
    groups = planner_field.by_method(results)
    assert set(groups) == {"all", "lora", "qlora"}
    assert groups["qlora"]["lowest_signed_error_pct"] == -8.5
    assert groups["qlora"]["under_planned_beyond_limit"] == 1
    assert groups["lora"]["under_planned_beyond_limit"] == 0
    assert groups["all"]["count"] == 3 and groups["all"]["median_signed_error_pct"] == -4.0
    text = planner_field.table([], planner_field.summarize(results))
    assert "LLM qlora" in text and "-8.5%" in text


def test_llm_errors_are_reported_signed_per_source() -> None:
    results = [
        {
            "method": "lora",
            "source_repo": "a/x",
            "comparisons": [{"kind": "max_allocated", "error_pct": -6.0}],
        },
        {
            "method": "qlora",
            "source_repo": "b/y",
            "comparisons": [{"kind": "max_allocated", "error_pct": 2.0}],
        },
        {
            "method": "full",
            "source_repo": "b/y",
            "comparisons": [{"kind": "max_allocated", "error_pct": 4.0}],
        },
    ]
    groups = planner_field.by_method(results, "source_repo")
    assert set(groups) == {"all", "a/x", "b/y"}
    assert groups["a/x"]["under_planned_beyond_limit"] == 1
    assert groups["b/y"]["median_signed_error_pct"] == 3.0
    assert "LLM from b/y" in planner_field.table([], planner_field.summarize(results))


def test_the_llm_cases_come_from_more_than_one_project() -> None:
    # A correction tuned on one project's tables need not carry over to another's.
    sources = [case["source"]["repo"] for case in LLM_CASES]
    assert len(set(sources)) >= 2
    assert sum(source != "Lightning-AI/litgpt" for source in sources) >= 7
