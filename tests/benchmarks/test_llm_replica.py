"""LLM fine-tunes planned as the libraries run them: a tiny Llama through the field benchmark's
replica (`benchmarks.llm_replica`), with LoRA, 4-bit layers, bitsandbytes' version rules, paged
optimizers and transformers' fp32 loss."""

from __future__ import annotations

import copy
import math
from pathlib import Path

import pytest
from omegaconf import OmegaConf

pytest.importorskip("transformers")
pytest.importorskip("peft")

from benchmarks import planner_field
from vramkit.core.hardware.profile import ProfileSource, validate_profile
from vramkit.core.planner import plan_json, plan_table
from vramkit.core.planner.decisions.host_memory import HostPlanner, LoaderSettings
from vramkit.core.planner.decisions.llm_allowance import LLM_ACTIVATION_ALLOWANCE, LLM_ALLOWANCE
from vramkit.core.planner.decisions.plan import MemoryPlanner
from vramkit.core.planner.decisions.report import bitsandbytes_lines, llm_allowance_lines
from vramkit.core.planner.decisions.task_plan import MemoryPlan
from vramkit.core.planner.tracing.recorder import OPTIMIZER_STATE
from vramkit.core.quantization.bitsandbytes_rules import bitsandbytes_rules_of
from vramkit.core.run.settling.plan_request_from_config import module_factory
from vramkit.core.units import GIB

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"
VOCAB, SEQ = 4096, 64
TINY = {
    "id": "tiny_llama_qlora",
    "method": "qlora",
    "gpu": {"compute_capability": "8.0", "flash_attention": True},
    "model": {
        "config": "llama",
        "config_overrides": {
            "vocab_size": VOCAB,
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 4,
            "max_position_embeddings": SEQ,
        },
        "task": "causal_lm",
        "num_labels": None,
        "attn_implementation": "sdpa",
        "loss": "model",
        "llm": {
            "load_dtype": "bfloat16",
            "quantization": {"kind": "4bit", "compute_dtype": "bfloat16"},
            "kbit_preparation": True,
            "lora": {"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]},
        },
    },
    "run": {
        "phase": "train",
        "batch_size": 2,
        "accumulate_grad_batches": 1,
        "seq_len": SEQ,
        "image_size": None,
        "precision": "bf16-mixed",
        "optimizer": {"_target_": "torch.optim.AdamW", "_partial_": True, "lr": 1e-4},
        "optimizer_layout": "configured",
        "gradient_checkpointing": False,
    },
}


def _plan(case: dict, batch_size: int = 2):
    planner = MemoryPlanner(
        module_factory(planner_field.model_config(case)), planner_field.phase_samples(case)
    )
    return planner.measure("train", batch_size, planner_field.run_setup(case))


def _with(**changes) -> dict:
    case = copy.deepcopy(TINY)
    for path, value in changes.items():
        node = case
        *parents, leaf = path.split("__")
        for key in parents:
            node = node[key]
        node[leaf] = value
    return case


def test_bitsandbytes_up_to_0_43_1_plans_every_4bit_input_kept_for_backward():
    with bitsandbytes_rules_of("0.43.1"):
        old = _plan(TINY)
    with bitsandbytes_rules_of("0.43.2"):
        new = _plan(TINY)
    assert old.allocated["activations"] > new.allocated["activations"]
    assert old.bitsandbytes.version == "0.43.1" and new.bitsandbytes.version == "0.43.2"
    assert "bitsandbytes 0.43.2" in bitsandbytes_lines(new)[0]


def test_the_loss_upcasts_the_logits_to_fp32_and_the_trace_holds_them():
    """transformers' `ForCausalLMLoss` casts the logits to fp32: a [B*T, V] fp32 tensor lives at
    the loss (the plan's peak holders show it for a model whose vocabulary dominates)."""
    plan = _plan(_with(run__precision="bf16-true", model__llm__kbit_preparation=False))
    fp32_logits = [
        holder
        for holder in plan.holders
        if holder.dtype == "float32" and VOCAB in holder.largest_shape
    ]
    assert fp32_logits, plan.holders


def test_a_paged_optimizer_keeps_large_moments_out_of_the_device_plan():
    case = _with(model__llm__lora=None, model__llm__quantization=None)
    case["model"]["llm"]["kbit_preparation"] = False
    case["run"]["precision"] = "bf16-true"
    plain = _plan(case)
    paged_case = copy.deepcopy(case)
    paged_case["run"]["optimizer_layout"] = "paged_adamw_8bit"
    paged = _plan(paged_case)
    assert paged.paged_optimizer_state > 0
    assert paged.allocated[OPTIMIZER_STATE] < plain.allocated[OPTIMIZER_STATE]
    lines = bitsandbytes_lines(paged)
    assert any("unified memory" in line for line in lines)
    assert paged.paged_optimizer_state < GIB


def test_the_host_plan_counts_a_paged_optimizer_s_states():
    case = _with(model__llm__lora=None, model__llm__quantization=None)
    case["model"]["llm"]["kbit_preparation"] = False
    case["run"]["optimizer_layout"] = "paged_adamw_8bit"
    planner = MemoryPlanner(
        module_factory(planner_field.model_config(case)), planner_field.phase_samples(case)
    )
    setup = planner_field.run_setup(case)
    host = HostPlanner(planner, setup, LoaderSettings(num_workers=0), baseline=0)
    traced = planner.measure("train", 2, setup)
    assert host.plan("train", 2, 2).offloaded == traced.paged_optimizer_state > 0
    plain = HostPlanner(
        planner, setup.replace(optimizer="configured"), LoaderSettings(num_workers=0), baseline=0
    )
    assert plain.plan("train", 2, 2).offloaded == 0


def test_kbit_preparation_makes_the_4bit_layers_return_fp32():
    """fp32 norms make each 4-bit layer's input fp32; `Linear4bit` casts its output back."""
    prepared = _plan(TINY)
    unprepared = _plan(_with(model__llm__kbit_preparation=False, model__llm__lora=None))
    assert prepared.allocated["activations"] > unprepared.allocated["activations"]


def test_logits_kept_to_the_next_step_stay_at_the_backward_peak():
    """LitGPT's loop variable keeps one micro-batch's [B, T, V] bf16 logits through its backward:
    the replica keeping them plans at least those bytes more at the peak."""
    base = _with(
        run__precision="bf16-true",
        model__llm__kbit_preparation=False,
        model__llm__quantization=None,
        model__llm__loss_in_logits_dtype=True,
    )
    kept = copy.deepcopy(base)
    kept["model"]["llm"]["logits_kept_to_next_step"] = True
    freed, held = _plan(base), _plan(kept)
    logits = 2 * SEQ * VOCAB * 2  # batch 2, bf16
    assert held.allocated["activations"] - freed.allocated["activations"] >= logits


def _litgpt_loss(**llm) -> dict:
    case = _with(
        run__precision="bf16-true",
        model__llm__kbit_preparation=False,
        model__llm__quantization=None,
        model__llm__loss_in_logits_dtype=True,
        model__llm__logits_kept_to_next_step=True,
    )
    case["model"]["llm"].update(llm)
    return case


def test_fabric_s_fp32_outputs_hold_more_logits_bytes_than_bf16_ones():
    """Fabric casts the model's outputs to fp32 (`convert_output`): the kept logits alone are
    2 bytes per element more than bf16 ones, and the bf16 chunks are live beside them as the
    forward returns."""
    bf16 = _plan(_litgpt_loss(lm_head_chunk_tokens=16))
    fp32 = _plan(_litgpt_loss(lm_head_chunk_tokens=16, output_dtype="float32"))
    logits = 2 * SEQ * VOCAB  # batch 2
    assert fp32.peak - bf16.peak >= 2 * logits


def test_litgpt_s_chunked_loss_frees_the_whole_logits_gradient():
    """One chunk's gradients at a time in the backward of LitGPT's chunked cross entropy: the
    peak is lower than with one cross entropy over all positions, by at least one [B, T, V]
    fp32 gradient less one chunk's."""
    chunk = 16
    whole = _plan(_litgpt_loss(output_dtype="float32"))
    chunked = _plan(_litgpt_loss(lm_head_chunk_tokens=chunk, output_dtype="float32"))
    logits = 2 * SEQ * VOCAB  # batch 2
    assert whole.peak - chunked.peak >= 4 * logits * (SEQ - chunk) // SEQ


def test_an_adapter_fine_tune_carries_the_llm_activation_allowance_and_says_so():
    qlora = _plan(TINY)
    share = qlora.allocated[LLM_ALLOWANCE]
    assert share == qlora.llm_activation_allowance > 0
    assert share == math.ceil(LLM_ACTIVATION_ALLOWANCE * qlora.allocated["activations"])
    assert qlora.breakdown_gib()["activations"] * GIB >= qlora.allocated["activations"] + share
    assert "LLM activation allowance" in llm_allowance_lines(None, qlora)[0]


def test_a_full_fine_tune_of_the_same_causal_lm_carries_no_allowance():
    full = _plan(
        _with(
            model__llm__lora=None, model__llm__quantization=None, model__llm__kbit_preparation=False
        )
    )
    assert LLM_ALLOWANCE not in full.allocated
    assert llm_allowance_lines(full) == []


def test_the_plan_table_and_json_show_the_allowance():
    train = _plan(TINY)
    hw = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "hw" / "t4.yaml"))
    plan = MemoryPlan(
        profile=validate_profile(hw, ProfileSource("t4")),
        setup=planner_field.run_setup(TINY),
        optimizer="AdamW",
        budget_bytes=None,
        train=train,
        val=train,
        inference=train,
        train_searched=False,
        val_searched=False,
        train_limit=None,
        val_limit=None,
        remedies=(),
        traces=1,
        seconds=1.0,
        planner=None,
    )
    lines = [line for line in plan_table(plan).splitlines() if "LLM activation allowance" in line]
    assert len(lines) == 1
    shown = plan_json(plan)["allowances"]["llm_activation_gib"]
    assert shown == round(train.llm_activation_allowance / GIB, 3) > 0
