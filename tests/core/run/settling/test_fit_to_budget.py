"""plan_within_budget: a run over budget is fitted (hw.fit=auto), refused (off) or, on a CPU
rehearsal, told what its GPU would do; the chosen overrides are what the run then is.

The plan comes from the formula planner of tests/core/planner/decisions/test_auto_fit.py (fast and
exact); the end-to-end tests at the bottom trace the tiny text classifier.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from vramkit.core.config import settings_schemas
from vramkit.core.config.settings import Settings
from vramkit.core.hardware.detect import DeviceInfo
from vramkit.core.hardware.profile import HardwareProfile
from vramkit.core.planner.decisions.plan import INFERENCE, TRAIN, VAL
from vramkit.core.planner.decisions.task_plan import MemoryPlan
from vramkit.core.planner.errors import DoesNotFitError
from vramkit.core.run.settling import fit_to_budget as fit_module
from vramkit.core.run.settling.fit_to_budget import (
    FIT_DECISION,
    loader_settings,
    plan_within_budget,
    write_fit_decision,
)
from vramkit.core.run.settling.settle import settle, settled_config
from vramkit.core.run.train import train
from vramkit.core.units import GIB

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "planner"))
from formula_planner import PROFILE, FormulaPlanner, LoraSetup

T4 = DeviceInfo("cuda", "Tesla T4", 14.57, (7, 5), count=1, cpu_count=2)
TINY_TEXT = (
    "task=text_classification",
    "hw.batch_size=4",
    "hw.val_batch_size=4",
    "data.max_length=32",
)
needs_bitsandbytes = pytest.mark.skipif(
    importlib.util.find_spec("bitsandbytes") is None,
    reason="8-bit AdamW is a remedy only where bitsandbytes is installed (extra bnb)",
)
# Between the tiny classifier's traced training peak at batch 4 on a T4 (669,410,918 B) and at
# micro-batch 2 with accumulation (667,313,766 B, as validation at 4).
TINY_BUDGET = 668_000_000


def formula_plan(request):
    """plan_task's stand-in: the formula planner at the requested sizes (1 for a search)."""
    profile = request.profile
    train_batch_size, val_batch_size = request.train_batch_size, request.val_batch_size
    planner = FormulaPlanner(per_sample_gib=6.0)
    setup = LoraSetup(precision=profile.precision, device=None)
    budget = int(profile.budget_gib * GIB)
    return MemoryPlan(
        profile=profile,
        setup=setup,
        optimizer="AdamW",
        budget_bytes=budget,
        train=planner.measure(TRAIN, train_batch_size or 1, setup),
        val=planner.measure(VAL, val_batch_size or 1, setup),
        inference=planner.measure(INFERENCE, val_batch_size or 1, setup),
        train_searched=train_batch_size is None,
        val_searched=val_batch_size is None,
        train_limit=None,
        val_limit=None,
        remedies=(),
        traces=2,
        seconds=0.0,
        planner=planner,
    )


@pytest.fixture
def formula(monkeypatch):
    monkeypatch.setattr(fit_module, "plan_task", formula_plan)


def run_config():
    return OmegaConf.create(
        {
            "hw": {"batch_size": 1},
            "model": {"gradient_checkpointing": False, "optimizer": {"_target_": "AdamW"}},
        }
    )


def profile(budget_gib: float, **changes):
    # PROFILE plans 85% of memory_gib
    return PROFILE.model_copy(
        update={"memory_gib": budget_gib / 0.85, "batch_size": 1, "val_batch_size": 1, **changes}
    )


def test_a_run_that_fits_is_left_alone(formula):
    cfg = run_config()
    outcome = plan_within_budget(cfg, profile(40.0), rehearsal=False)
    assert outcome.decision is None and not outcome.applied and outcome.record() is None
    assert cfg == run_config()


@needs_bitsandbytes
def test_auto_hands_back_exactly_the_printed_overrides(formula):
    cfg = run_config()
    outcome = plan_within_budget(cfg, profile(15.0), rehearsal=False)
    lines = outcome.lines
    assert outcome.applied
    (applies,) = [line for line in lines if "automatic fit (hw.fit=auto) applies: " in line]
    printed = applies.split("applies: ", 1)[1].split(" (", 1)[0]
    assert printed.split() == list(outcome.decision.chosen.overrides)
    assert printed == (
        "model.gradient_checkpointing=true model.optimizer._target_=bitsandbytes.optim.AdamW8bit"
    )
    assert outcome.remedy == tuple(printed.split())  # composed into the run's config
    assert cfg == run_config()  # the user's config is left as composed
    table = next(line for line in lines if "remedies tried from cheapest" in line)
    assert "<- chosen" in table and "16.600" in table  # checkpointing alone, traced
    assert outcome.record()["applied"] is True


def test_off_refuses_with_the_remedies_listed(formula):
    cfg = run_config()
    with pytest.raises(DoesNotFitError) as refused:
        plan_within_budget(cfg, profile(15.0, fit="off"), rehearsal=False)
    message = str(refused.value)
    assert "hw.fit=off" in message
    assert "model.gradient_checkpointing=true" in message
    assert "fits  bf16-true: 14.00 / 9.50  hw.precision=bf16-true" in message
    assert cfg == run_config()


@needs_bitsandbytes
def test_a_cpu_rehearsal_says_what_the_gpu_run_would_apply_and_changes_nothing(formula):
    cfg = run_config()
    outcome = plan_within_budget(cfg, profile(15.0), rehearsal=True)
    lines = outcome.lines
    assert not outcome.applied and outcome.record()["applied"] is False
    assert cfg == run_config()
    would = next(line for line in lines if "the run would apply:" in line)
    assert "model.gradient_checkpointing=true" in would and "rehearsal runs without it" in would

    refused = plan_within_budget(cfg, profile(15.0, fit="off"), rehearsal=True)
    assert any("would be refused (hw.fit=off)" in line for line in refused.lines)


def test_nothing_that_fits_is_a_refusal_naming_the_closest(formula):
    with pytest.raises(DoesNotFitError, match="no combination of remedies"):
        plan_within_budget(run_config(), profile(2.0), rehearsal=False)


@needs_bitsandbytes
def test_the_decision_is_written_as_json(formula, tmp_path):
    outcome = plan_within_budget(run_config(), profile(15.0), rehearsal=False)
    path = write_fit_decision(tmp_path, outcome.record())
    data = json.loads(path.read_text())
    assert path.name == FIT_DECISION
    assert data["chosen"] == "gradient checkpointing + 8-bit AdamW"
    assert data["overrides"] == list(outcome.decision.chosen.overrides)
    assert data["requested"]["train"]["peak_gib"] > data["budget_gib"]
    assert all("train" in c and "val" in c for c in data["candidates"])


@pytest.mark.slow
def test_the_fitted_run_is_the_run_with_the_printed_overrides(compose_config):
    """Traces the tiny classifier: auto fit on a T4 with a tiny budget, then the same command
    with the printed overrides appended; both settle to the same config."""
    memory = f"hw.memory_gib={TINY_BUDGET / GIB / 0.85}"
    fitted = settle(compose_config("+hw=t4", *TINY_TEXT, memory), device=T4)
    record = fitted.remedy_record
    assert record["applied"] and record["chosen"] == "micro-batch 2 × accumulate 2"
    printed = "\n".join(fitted.decisions).split("applies: ", 1)[1].split(" (", 1)[0].split()
    assert printed == record["overrides"] == ["hw.batch_size=2", "hw.accumulate_grad_batches=2"]
    assert fitted.remedy == ("++hw.batch_size=2", "++hw.accumulate_grad_batches=2")

    typed = settle(compose_config("+hw=t4", *TINY_TEXT, memory, *printed), device=T4)
    assert typed.remedy_record is None  # it fits as typed
    assert OmegaConf.to_container(settled_config(fitted), resolve=True) == OmegaConf.to_container(
        settled_config(typed), resolve=True
    )


@pytest.mark.slow
@needs_bitsandbytes
def test_a_rehearsed_run_writes_what_its_gpu_would_do(compose_config, formula):
    cfg = compose_config("+hw=t4", "hw.strict=false", *TINY_TEXT, "train=false")
    train(cfg)
    data = json.loads((Path(cfg.paths.output_dir) / FIT_DECISION).read_text())
    assert data["applied"] is False and data["profile"] == "t4"
    assert data["chosen"] == "gradient checkpointing + 8-bit AdamW"
    assert cfg.model.gradient_checkpointing is False  # the CPU rehearsal runs as requested
    assert cfg.hw.batch_size == 4


class _ShortLivedWorkers(Settings):
    persistent_workers: bool = False


def test_loader_settings_read_a_class_default_as_its_value(monkeypatch):
    # ??? in the data YAML composes as ${settings_default:…}: the planner must see the class's
    # value, not fall back to its own default (True) because the raw value is no bool
    monkeypatch.setattr(settings_schemas, "settings_class_of", lambda target: _ShortLivedWorkers)
    default = "${settings_default:some.DataModule,persistent_workers}"
    cfg = OmegaConf.create({"data": {"persistent_workers": default, "num_workers": 2}})
    settings = loader_settings(
        cfg, HardwareProfile(name="cpu", accelerator="cpu", precision="32-true")
    )
    assert settings.persistent_workers is False
    assert settings.num_workers == 2
