"""plan_within_budget: a run over budget is fitted (hw.fit=auto), refused (off) or, on a CPU
rehearsal, told what its GPU would do; the chosen overrides are what the run then is.

The plan comes from the formula planner of tests/core/planner/decisions/test_auto_fit.py (fast and
exact). The run's side (a composed config, the tiny classifier traced) is in
tests/core/run/settling/test_fit_to_budget.py.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from vramkit.core.planner.decisions import within_budget
from vramkit.core.planner.decisions.within_budget import plan_within_budget
from vramkit.core.planner.errors import DoesNotFitError
from vramkit.core.planner.request import PlanRequest
from vramkit.core.planner.tracing.run_setup import RunSetup
from vramkit.core.run.settling.fit_to_budget import FIT_DECISION, write_fit_decision

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from formula_planner import PROFILE, formula_plan

needs_bitsandbytes = pytest.mark.skipif(
    importlib.util.find_spec("bitsandbytes") is None,
    reason="8-bit AdamW is a remedy only where bitsandbytes is installed (extra bnb)",
)


@pytest.fixture
def formula(monkeypatch):
    monkeypatch.setattr(within_budget, "plan_task", formula_plan)


def request_on(budget_gib: float, **changes) -> PlanRequest:
    """The requested run at batch 1 on PROFILE with `budget_gib` (PROFILE plans 85% of
    memory_gib); the formula plan builds no module and reads no data."""
    profile = PROFILE.model_copy(
        update={"memory_gib": budget_gib / 0.85, "batch_size": 1, "val_batch_size": 1, **changes}
    )
    return PlanRequest(
        module=lambda overrides: None,
        data=lambda: None,
        profile=profile,
        setup=RunSetup.from_profile(profile),
        train_batch_size=1,
        val_batch_size=1,
        with_remedies=False,
    )


def test_a_run_that_fits_is_left_alone(formula):
    outcome = plan_within_budget(request_on(40.0), rehearsal=False)
    assert outcome.decision is None and not outcome.applied and outcome.record() is None


@needs_bitsandbytes
def test_auto_hands_back_exactly_the_printed_overrides(formula):
    outcome = plan_within_budget(request_on(15.0), rehearsal=False)
    lines = outcome.lines
    assert outcome.applied
    (applies,) = [line for line in lines if "automatic fit (hw.fit=auto) applies: " in line]
    printed = applies.split("applies: ", 1)[1].split(" (", 1)[0]
    assert printed.split() == list(outcome.decision.chosen.overrides)
    assert printed == (
        "model.gradient_checkpointing=true model.optimizer._target_=bitsandbytes.optim.AdamW8bit"
    )
    assert outcome.remedy == tuple(printed.split())  # composed into the run's config
    table = next(line for line in lines if "remedies tried from cheapest" in line)
    assert "<- chosen" in table and "16.600" in table  # checkpointing alone, traced
    assert outcome.record()["applied"] is True


def test_off_refuses_with_the_remedies_listed(formula):
    with pytest.raises(DoesNotFitError) as refused:
        plan_within_budget(request_on(15.0, fit="off"), rehearsal=False)
    message = str(refused.value)
    assert "hw.fit=off" in message
    assert "model.gradient_checkpointing=true" in message
    assert "fits  bf16-true: 14.00 / 9.50  hw.precision=bf16-true" in message


@needs_bitsandbytes
def test_a_cpu_rehearsal_says_what_the_gpu_run_would_apply_and_changes_nothing(formula):
    outcome = plan_within_budget(request_on(15.0), rehearsal=True)
    lines = outcome.lines
    assert not outcome.applied and outcome.record()["applied"] is False
    would = next(line for line in lines if "the run would apply:" in line)
    assert "model.gradient_checkpointing=true" in would and "rehearsal runs without it" in would

    refused = plan_within_budget(request_on(15.0, fit="off"), rehearsal=True)
    assert any("would be refused (hw.fit=off)" in line for line in refused.lines)


def test_nothing_that_fits_is_a_refusal_naming_the_closest(formula):
    with pytest.raises(DoesNotFitError, match="no combination of remedies"):
        plan_within_budget(request_on(2.0), rehearsal=False)


@needs_bitsandbytes
def test_the_decision_is_written_as_json(formula, tmp_path):
    outcome = plan_within_budget(request_on(15.0), rehearsal=False)
    path = write_fit_decision(tmp_path, outcome.record())
    data = json.loads(path.read_text())
    assert path.name == FIT_DECISION
    assert data["chosen"] == "gradient checkpointing + 8-bit AdamW"
    assert data["overrides"] == list(outcome.decision.chosen.overrides)
    assert data["requested"]["train"]["peak_gib"] > data["budget_gib"]
    assert all("train" in c and "val" in c for c in data["candidates"])
