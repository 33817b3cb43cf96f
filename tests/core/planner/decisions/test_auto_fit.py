"""choose_fit: the cheapest combination of remedies that fits, consent and packages respected.

A stand-in planner computes each phase's peak from the setup with a formula (GiB), so every
decision here is exact and fast; tests/core/run/settling/test_fit_to_budget.py traces a real model.
"""

from __future__ import annotations

import sys

import pytest
from formula_planner import LORA_CHANGE, PROFILE, FormulaPlanner, LoraSetup

from vramkit.core.planner.decisions.auto_fit import (
    CHECKPOINTING,
    COST_ORDER,
    EIGHT_BIT,
    LORA,
    MICRO_BATCH,
    OFFLOAD,
    PRECISION,
    choose_fit,
    cost_rank,
    importable,
    missing_packages,
)
from vramkit.core.planner.decisions.plan import TRAIN
from vramkit.core.planner.decisions.remedies import Change, candidate_changes
from vramkit.core.planner.tracing.run_setup import RunSetup
from vramkit.core.units import GIB


def decide(
    planner: FormulaPlanner,
    budget_gib: float,
    *,
    train: int | None = 8,
    val: int | None = 8,
    allow: tuple[str, ...] = (),
    installed: tuple[str, ...] = ("bitsandbytes", "deepspeed", "peft"),
    with_lora: bool = True,
):
    profile = PROFILE.model_copy(update={"fit_allow": allow})
    setup = LoraSetup(precision="bf16-mixed", device=None)
    changes = candidate_changes(profile, setup, planner) + ([LORA_CHANGE] if with_lora else [])
    requested = (
        planner.measure(TRAIN, train or 1, setup),
        planner.measure("val", val or 1, setup),
    )
    return choose_fit(
        planner,
        profile,
        setup,
        requested,
        train_batch_size=train,
        val_batch_size=val,
        budget_bytes=int(budget_gib * GIB),
        can_import=lambda module: module in installed,
        changes=changes,
    )


def test_the_stated_order_of_cost():
    assert COST_ORDER[MICRO_BATCH].startswith("micro-batch")
    assert MICRO_BATCH < CHECKPOINTING < EIGHT_BIT < LORA < OFFLOAD
    planner = FormulaPlanner()
    ranks = {
        c.name: cost_rank(c)
        for c in candidate_changes(PROFILE, RunSetup("16-mixed", None), planner)
    }
    assert ranks == {
        "gradient checkpointing": CHECKPOINTING,
        "8-bit AdamW": EIGHT_BIT,
        "bf16-true": PRECISION,
        "DeepSpeed ZeRO-2, CPU offload": OFFLOAD,
    }
    assert cost_rank(LORA_CHANGE) == LORA


def test_a_smaller_micro_batch_comes_first_when_it_fits():
    # model states 13 GiB + 8 samples × 1 GiB = 21 GiB; a micro-batch of 2 fits 16 GiB
    decision = decide(FormulaPlanner(parameters_gib=13 / 16), budget_gib=16.0)
    assert decision.chosen is decision.candidates[0]
    assert decision.chosen.overrides == ("hw.batch_size=2", "hw.accumulate_grad_batches=4")
    assert decision.chosen.train.batch_size * decision.chosen.train.accumulate_grad_batches == 8


def test_a_micro_batch_is_combined_before_a_dearer_remedy():
    # model states 16 GiB, over 15 GiB with any batch; 8-bit AdamW (10 GiB) with a micro-batch
    # of 4 fits, and a micro-batch is cheaper than checkpointing
    decision = decide(FormulaPlanner(), budget_gib=15.0)
    assert decision.chosen.name == "8-bit AdamW + micro-batch 4 × accumulate 2"
    costs = [candidate.cost for candidate in decision.candidates]
    assert costs == sorted(costs)


def test_checkpointing_before_an_8_bit_optimizer_and_combinations_before_dearer_remedies():
    # One sample of 6 GiB: 8-bit AdamW alone (16 GiB) and checkpointing alone (16.6 GiB) do not
    # fit 15 GiB, both together do (10.6 GiB), which is cheaper than bf16-true (14 GiB) or LoRA.
    decision = decide(FormulaPlanner(per_sample_gib=6.0), budget_gib=15.0, train=1, val=1)
    tried = [candidate.name for candidate in decision.candidates]
    assert tried == [
        "gradient checkpointing",
        "8-bit AdamW",
        "gradient checkpointing + 8-bit AdamW",
    ]
    assert decision.chosen is decision.candidates[-1]
    assert decision.chosen.overrides == (
        "model.gradient_checkpointing=true",
        "model.optimizer._target_=bitsandbytes.optim.AdamW8bit",
    )


def test_lora_is_never_applied_without_consent():
    # Only LoRA (4 GiB of frozen weights) or offload fits a 5 GiB budget.
    planner = FormulaPlanner(per_sample_gib=0.05)
    without = decide(planner, budget_gib=5.0, train=1, val=1)
    lora = next(c for c in without.candidates if c.name == "LoRA r=8")
    assert lora.fits and not lora.usable
    assert "with hw.fit_allow=[lora] (LoRA r=8 changes what is trained)" in lora.verdict()
    assert without.chosen.name == "DeepSpeed ZeRO-2, CPU offload"
    assert "hw.fit_allow=[lora]" in without.table()

    allowed = decide(planner, budget_gib=5.0, train=1, val=1, allow=("lora",))
    assert allowed.chosen.name == "LoRA r=8"
    assert allowed.chosen.overrides == ("model.lora.r=8",)


def test_a_remedy_needing_a_missing_package_is_named_not_chosen():
    planner = FormulaPlanner(per_sample_gib=6.0)
    decision = decide(planner, budget_gib=15.0, train=1, val=1, installed=("deepspeed",))
    eight_bit = [c for c in decision.candidates if "8-bit AdamW" in c.name and c.fits]
    assert eight_bit and all("after pip install bitsandbytes" in c.verdict() for c in eight_bit)
    assert decision.chosen.name == "bf16-true"
    assert missing_packages(LORA_CHANGE, lambda module: False) == ["pip install peft"]
    qlora = Change(
        "QLoRA", ("+model/lora=default", "model.lora.quantize=4bit"), "", {}, needs_consent="lora"
    )
    assert missing_packages(qlora, lambda module: module == "peft") == ["pip install bitsandbytes"]


def test_nothing_fits_gives_a_refusal_with_the_closest_candidates():
    decision = decide(FormulaPlanner(parameters_gib=10.0), budget_gib=8.0, with_lora=False)
    assert decision.chosen is None
    refusal = decision.refusal()
    assert "no combination of remedies" in refusal
    best = decision.best()
    assert best[0].name in refusal
    assert max(best[0].train.peak, best[0].val.peak) <= max(best[-1].train.peak, best[-1].val.peak)


def test_the_decision_as_json_and_table():
    decision = decide(FormulaPlanner(), budget_gib=15.0)
    data = decision.as_json()
    assert data["chosen"] == decision.chosen.name
    assert data["overrides"] == list(decision.chosen.overrides)
    assert data["requested"]["train"]["peak_gib"] == pytest.approx(24.0, abs=0.01)
    assert [c["name"] for c in data["candidates"]] == [c.name for c in decision.candidates]
    table = decision.table()
    assert "requested run" in table and "<- chosen" in table
    for candidate in decision.candidates:
        assert f"{candidate.train.peak_gib:.3f}" in table


def test_auto_batch_sizes_are_traced_at_batch_1_without_micro_batches():
    decision = decide(FormulaPlanner(), budget_gib=15.0, train=None, val=None)
    assert decision.auto_batch
    assert all(c.train.batch_size == 1 for c in decision.candidates)
    assert not any("micro-batch" in c.name for c in decision.candidates)
    assert decision.chosen.name == "8-bit AdamW"


def test_a_library_kept_from_loading_still_counts_as_installed(monkeypatch):
    # `vramkit plan --hf` keeps bitsandbytes from loading (None in sys.modules, which makes
    # find_spec answer None): its remedies must not tell the user to install it.
    monkeypatch.setitem(sys.modules, "omegaconf", None)
    assert importable("omegaconf")
    assert not importable("no_such_library_vramkit")
