"""When a run does not fit, the plan lists remedies, each re-planned with its own peaks."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from planning_models import CONV_MODEL, IMAGE_DATA, task_config

from vramkit.core.hardware.profile import ProfileSource, validate_profile
from vramkit.core.planner import TRAIN, plan_json, plan_table, plan_task
from vramkit.core.planner.decisions.auto_fit import choose_fit
from vramkit.core.planner.decisions.plan import MemoryPlanner
from vramkit.core.run.settling.plan_request_from_config import plan_request
from vramkit.core.units import GIB

CONF_DIR = Path(__file__).resolve().parents[4] / "conf"
REQUESTED = (1024, 256)


@pytest.fixture(scope="module")
def over_budget_plan():
    """A T4 profile whose budget fits the tiny model at micro-batch 256 but not at 1024."""
    hw = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "hw" / "t4.yaml"))
    probe = plan_task(
        plan_request(
            task_config(CONV_MODEL, IMAGE_DATA, hw),
            validate_profile(hw, ProfileSource("t4")),
            batch_sizes=(256, REQUESTED[1]),
            with_remedies=False,
        )
    )
    accumulating = probe.setup.replace(accumulate_grad_batches=4)
    needed = probe.planner.measure(TRAIN, 256, accumulating).peak
    hw["memory_gib"] = (needed + 2**20) / GIB / hw["memory_budget_fraction"]
    profile = validate_profile(hw, ProfileSource("t4"))
    cfg = task_config(CONV_MODEL, IMAGE_DATA, hw)
    return plan_task(plan_request(cfg, profile, batch_sizes=(REQUESTED[0], REQUESTED[1])))


def test_a_plan_over_budget_offers_remedies_that_were_traced(over_budget_plan):
    plan = over_budget_plan
    assert plan.fits is False
    names = [remedy.name for remedy in plan.remedies]
    assert names[0] == "micro-batch 256 × accumulate 4"
    micro = plan.remedies[0]
    assert micro.fits and micro.train.peak <= plan.budget_bytes
    assert micro.train.batch_size * micro.train.accumulate_grad_batches == REQUESTED[0]
    by_name = {remedy.name: remedy for remedy in plan.remedies}
    checkpointed = by_name["gradient checkpointing"].train.allocated["activations"]
    assert checkpointed < plan.train.allocated["activations"]
    eight_bit = by_name["8-bit AdamW"].train.allocated["optimizer_state"]
    qmaps = 2 * 256 * 4  # the 8-bit optimizer's two quantization maps, once per device
    assert eight_bit - qmaps < plan.train.allocated["optimizer_state"] / 3
    assert "trainer=deepspeed_zero2_offload" in by_name["DeepSpeed ZeRO-2, CPU offload"].how


def test_the_table_and_json_say_what_does_not_fit_and_what_would(over_budget_plan):
    table = plan_table(over_budget_plan)
    assert "DOES NOT FIT" in table
    assert "fits  micro-batch 256 × accumulate 4" in table
    data = plan_json(over_budget_plan)
    assert data["profile"] == "t4" and data["fits"] is False
    assert data["budget_gib"] == pytest.approx(over_budget_plan.budget_gib, abs=1e-3)
    for phase in ("train", "val"):
        breakdown = data[phase]["breakdown"]
        parts = ("parameters", "gradients", "optimizer_state", "activations", "overhead")
        assert sum(breakdown[key] for key in parts) == pytest.approx(breakdown["total"], abs=0.01)
        assert data[phase]["peak_gib"] == breakdown["total"]
    assert data["train"]["batch_size"] == REQUESTED[0]
    assert data["remedies"][0]["fits"] is True
    assert data["remedies"][0]["train"]["peak_gib"] <= data["budget_gib"]
    assert data["traced_versions"]["torch"] == torch.__version__
    assert f"traced with torch {torch.__version__}" in table
    assert data["untested_torch"] is None  # CI runs the tested versions only
    # The 8-bit AdamW remedy planned bitsandbytes' optimizer: the plan names the rules' release.
    assert table.splitlines()[-1].startswith("4-bit/8-bit rules of bitsandbytes ")
    assert data["bitsandbytes"] and data["bitsandbytes"][0] in table


def test_a_plan_on_an_untested_torch_says_so_in_one_line(over_budget_plan, monkeypatch):
    monkeypatch.setattr(torch, "__version__", "2.12.1")
    warnings = [line for line in plan_table(over_budget_plan).splitlines() if "tested" in line]
    assert len(warnings) == 1
    assert warnings[0].startswith("warning: torch 2.12.1 is outside the tested range torch>=2.13")
    assert plan_json(over_budget_plan)["untested_torch"] == warnings[0]


@pytest.fixture(scope="module")
def optimizer_step_peak():
    """Wide conv blocks at batch 1: AdamW creating its state is the peak, not the forward."""
    hw = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "hw" / "t4.yaml"))
    model = {**CONV_MODEL, "channels": 512}

    def config(hw: dict):
        cfg = task_config(model, IMAGE_DATA, hw)
        cfg.callbacks = {"activation_offload": {"enabled": False}}
        return cfg

    probe = plan_task(
        plan_request(
            config(hw),
            validate_profile(hw, ProfileSource("t4")),
            batch_sizes=(1, 1),
            with_remedies=False,
        )
    )
    hw["memory_gib"] = probe.train.peak / 2 / GIB / hw["memory_budget_fraction"]
    return config(hw), validate_profile(hw, ProfileSource("t4"))


def _remedies(cfg, profile):
    plan = plan_task(plan_request(cfg, profile, batch_sizes=(1, 1)))
    return plan, {remedy.name: remedy for remedy in plan.remedies}


def test_saving_less_for_backward_is_not_traced_where_the_optimizer_step_is_the_peak(
    optimizer_step_peak, monkeypatch
):
    plan, remedies = _remedies(*optimizer_step_peak)
    assert plan.train.peak_at == "step 1: optimizer step"
    for name in ("gradient checkpointing", "CPU activation offload"):
        floor = remedies[name].train
        assert floor.at_least and not remedies[name].fits
        assert floor.allocated == plan.train.allocated
        assert plan.budget_bytes < floor.peak <= plan.train.peak
    assert not remedies["8-bit AdamW"].train.at_least
    table = plan_table(plan)
    floor_gib = remedies["gradient checkpointing"].train.peak_gib
    assert f"gradient checkpointing: ≥ {floor_gib:.2f}" in table
    assert '(a bound, not traced: the peak is at "step 1: optimizer step"' in table
    by_name = {remedy["name"]: remedy for remedy in plan_json(plan)["remedies"]}
    assert by_name["gradient checkpointing"]["train"]["at_least"] is True

    # Traced instead, the verdicts are the same and the bounds hold, at a trace each.
    bounded = [name for name, remedy in remedies.items() if remedy.train.at_least]
    assert "gradient checkpointing + CPU activation offload" in bounded
    monkeypatch.setattr(MemoryPlanner, "training_floor", lambda *_: None)
    traced_plan, traced = _remedies(*optimizer_step_peak)
    assert traced_plan.traces == plan.traces + len(bounded)
    for name in bounded:
        assert not traced[name].fits and not traced[name].train.at_least
        assert traced[name].train.allocated_peak >= remedies[name].train.allocated_peak
        assert traced[name].train.peak >= remedies[name].train.peak


def test_the_automatic_fit_takes_the_same_bound_and_says_so(optimizer_step_peak):
    cfg, profile = optimizer_step_peak
    plan = plan_task(plan_request(cfg, profile, batch_sizes=(1, 1), with_remedies=False))
    decision = choose_fit(
        plan.planner,
        profile,
        plan.setup,
        (plan.train, plan.val),
        train_batch_size=1,
        val_batch_size=1,
        budget_bytes=plan.budget_bytes,
    )
    checkpointed = next(c for c in decision.candidates if c.name == "gradient checkpointing")
    assert checkpointed.train.at_least and not checkpointed.fits
    assert f"≥ {checkpointed.train.peak_gib:.3f}" in decision.table()
    assert checkpointed.as_json()["train"]["at_least"] is True
