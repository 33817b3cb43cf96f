"""A Hugging Face Phi model planned from its config alone (no weights, no GPU)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from planning_models import TINY_PHI, task_config

from vramkit.core.hardware.profile import ProfileSource, validate_profile
from vramkit.core.planner import plan_task
from vramkit.core.planner.cuda.cuda_rules import round_allocation
from vramkit.core.planner.decisions.remedies import propose_remedies
from vramkit.core.run.settling.plan_request_from_config import plan_request

pytest.importorskip("transformers")

CONF_DIR = Path(__file__).resolve().parents[4] / "conf"
PHI_15 = {  # Phi-1.5's public architecture, as a two-class classifier
    "vocab_size": 51200,
    "hidden_size": 2048,
    "intermediate_size": 8192,
    "num_hidden_layers": 24,
    "num_attention_heads": 32,
    "max_position_embeddings": 2048,
    "num_labels": 2,
    "pad_token_id": 0,
}


def phi_config(architecture: dict, sequence_length: int, hw: dict):
    model = {
        "_target_": "planning_models.PhiClassifier",
        "config": architecture,
        "optimizer": {"_target_": "torch.optim.AdamW", "_partial_": True, "lr": 2e-5},
    }
    data = {
        "_target_": "planning_models.RandomTokenDataModule",
        "sequence_length": sequence_length,
        "vocab_size": architecture["vocab_size"],
    }
    return task_config(model, data, hw)


def profile_values(name: str, **changes) -> dict:
    return {**OmegaConf.to_container(OmegaConf.load(CONF_DIR / "hw" / f"{name}.yaml")), **changes}


def parameter_count(architecture: dict) -> int:
    from transformers import AutoModelForSequenceClassification, PhiConfig

    with torch.device("meta"):
        model = AutoModelForSequenceClassification.from_config(PhiConfig(**architecture))
    return sum(p.numel() for p in model.parameters())


@pytest.fixture(scope="module")
def tiny_phi_plan():
    hw = profile_values("t4")
    profile = validate_profile(hw, ProfileSource("t4"))
    cfg = phi_config(TINY_PHI, 32, hw)
    return profile, plan_task(plan_request(cfg, profile, batch_sizes=(2, 2)))


def test_a_tiny_phi_plans_its_weights_states_and_attention_kernel(tiny_phi_plan):
    _, plan = tiny_phi_plan
    assert plan.fits is True
    # Hugging Face passes the padding mask, so flash is out; sm_75 runs memory-efficient SDPA.
    assert plan.train.attention_kernels == ("efficient",)
    numel = parameter_count(TINY_PHI)
    parameters = plan.train.allocated["parameters"]
    assert 4 * numel <= parameters <= 4 * numel + 60 * 512  # fp32 weights, blocks rounded
    assert plan.train.allocated["optimizer_state"] == pytest.approx(2 * parameters, rel=0.05)
    # bf16 on sm_75 is a trap (docs/hardware.md "Hardware facts"): attention takes the math path.
    bf16 = plan.planner.measure("train", 2, plan.setup.replace(precision="bf16-mixed"))
    assert bf16.attention_kernels == ("math",)
    assert bf16.allocated["activations"] > plan.train.allocated["activations"]


def test_a_phi_over_its_budget_gets_remedies_that_fit():
    hw = profile_values("t4")
    profile = validate_profile(hw, ProfileSource("t4"))
    # Activations of tens of MiB: a remedy's saving must outgrow the allocator's 2 / 20 MiB
    # segments, which a step of a few MiB never leaves (its reserve is segment-bound).
    plan = plan_task(plan_request(phi_config(TINY_PHI, 256, hw), profile, batch_sizes=(16, 2)))
    budget = plan.train.peak - 2**20  # just below what the run as configured needs
    remedies = propose_remedies(plan.planner, profile, plan.setup, plan.train, plan.val, budget)
    fitting = {remedy.name for remedy in remedies if remedy.fits}
    assert fitting & {"8-bit AdamW", "gradient checkpointing"}
    for remedy in remedies:
        assert remedy.fits == (max(remedy.train.peak, remedy.val.peak) <= budget)


@pytest.mark.slow
def test_phi_15_with_adamw_does_not_fit_a_16_gb_laptop_gpu():
    hw = profile_values("rtx4090_laptop")
    plan = plan_task(
        plan_request(
            phi_config(PHI_15, 256, hw),
            validate_profile(hw, ProfileSource("rtx4090_laptop")),
            batch_sizes=(8, 8),
            with_remedies=False,
        )
    )
    numel = parameter_count(PHI_15)
    assert 1.2e9 < numel < 1.5e9
    states = sum(plan.train.allocated[key] for key in ("parameters", "gradients"))
    states += plan.train.allocated["optimizer_state"]
    assert states == pytest.approx(16 * numel, rel=0.01)
    assert states > 16 * 10**9  # model states alone exceed a 16 GB card
    assert plan.fits is False
    assert plan.train.allocated["parameters"] >= round_allocation(4 * numel) - 4 * 10**6
