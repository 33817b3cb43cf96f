"""The plan-speed benchmark: its median, verdict and headline, without running a plan."""

from __future__ import annotations

import subprocess
from pathlib import Path

from benchmarks import plan_speed, run_all
from benchmarks.record import REPO_ROOT


def test_median_and_verdict_come_from_the_timed_runs(monkeypatch):
    calls = []
    times = iter([(99.0, 2), (12.0, 4), (9.0, 4), (9.5, 4)])  # the first run is not timed

    def fake_run(case, *extra):
        calls.append((case, extra))
        return next(times)

    floors = iter([7.0, 5.0, 6.0])
    monkeypatch.setattr(plan_speed, "run_once", fake_run)
    monkeypatch.setattr(plan_speed, "import_floor_once", lambda case: next(floors))
    result = plan_speed.measure("default", runs=3)
    assert calls[0] == ("default", ("--no-remedies",))
    assert result["cpu_s"] == [12.0, 9.0, 9.5]
    assert result["median_cpu_s"] == 9.5
    assert result["meets_target"] is True
    assert result["traces"] == 4
    # Each plan is paired with the floor measured right after it.
    assert result["import_floor_cpu_s"] == [7.0, 5.0, 6.0]
    assert result["median_import_floor_cpu_s"] == 6.0
    assert result["beyond_imports_cpu_s"] == [5.0, 4.0, 3.5]
    assert result["median_beyond_imports_cpu_s"] == 4.0


def test_an_llm_case_runs_the_installed_command_from_outside_the_checkout(monkeypatch):
    runs = []

    def fake_run(command, *, cwd, env, **_):
        runs.append((command, Path(cwd), env["PYTHONPATH"]))
        return subprocess.CompletedProcess(command, 1, stdout="(14 traces in 59.2 s; ...)")

    monkeypatch.setattr(plan_speed.subprocess, "run", fake_run)
    _, traces = plan_speed.run_once("llm_8b_qlora", "--no-remedies")
    command, cwd, path = runs[0]
    assert command[1:5] == ["-m", "vramkit.cli", "plan", "--hf"]
    assert command[5] == "meta-llama/Llama-3.1-8B" and command[-1] == "--no-remedies"
    assert "--qlora" in command and "--grad-ckpt" in command
    assert REPO_ROOT not in (cwd, *cwd.parents)  # outside the checkout
    assert path == str(REPO_ROOT) and traces == 14


def test_each_case_has_its_own_import_floor(monkeypatch):
    floors = []
    monkeypatch.setattr(
        plan_speed.subprocess, "run", lambda command, **_: floors.append(command[-1])
    )
    plan_speed.import_floor_once("llm_1b")
    plan_speed.import_floor_once("default")
    assert "peft" in floors[0] and "albumentations" not in floors[0]
    assert "albumentations" in floors[1] and "peft" not in floors[1]


def test_the_traces_count_is_read_from_the_plan_footer():
    footer = "(4 traces in 14.4 s; traced with torch 2.13.0+cpu, transformers 5.24.0)"
    assert plan_speed._TRACES.search(footer).group(1) == "4"


def test_make_bench_headline_shows_both_cases():
    results = {
        "default": {"median_cpu_s": 12.3, "median_import_floor_cpu_s": 7.1, "target_cpu_s": 10.0},
        "phi": {"median_cpu_s": 55.0, "target_cpu_s": 60.0},
        "targets_met": False,
    }
    value, target, met = run_all._headline("plan_speed", results)
    assert "12.3 s default" in value and "55.0 s Phi-1.5" in value
    assert "imports alone 7.1 s" in value
    assert target == "<= 10 / 60 s"
    assert met is False


def test_make_bench_headline_shows_the_llm_cases_when_measured():
    results = {
        "default": {"median_cpu_s": 6.6, "median_import_floor_cpu_s": 4.5, "target_cpu_s": 10.0},
        "phi": {"median_cpu_s": 36.2, "target_cpu_s": 60.0},
        "llm_8b_qlora": {"median_cpu_s": 41.0, "target_cpu_s": 15.0},
        "llm_1b": {"median_cpu_s": 19.0, "target_cpu_s": 5.0},
        "targets_met": False,
    }
    value, target, _ = run_all._headline("plan_speed", results)
    assert "41.0 s llm_8b_qlora" in value and "19.0 s llm_1b" in value
    assert target == "<= 10 / 60 / 15 / 5 s"
