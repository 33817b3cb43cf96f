"""Causal LMs of four families, shrunk to 6 blocks, planned with their traces rebuilt from 2, 3
and 4 blocks (`block_extrapolation`): every phase plan equals the whole model's trace byte for
byte (peaks, reserve, holder rows), full / LoRA / QLoRA, with and without gradient
checkpointing, bf16-mixed and bf16-true, at two batch sizes."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers", reason="task=causal_lm needs `transformers`")
pytest.importorskip("peft", reason="model.finetune=lora needs `peft`")

from vramkit.api import hf_overrides, load_profile
from vramkit.core.planner.decisions.plan import INFERENCE, TRAIN, VAL
from vramkit.core.planner.decisions.task_plan import task_planner
from vramkit.core.run.settling.compose import compose_config, forget_composition
from vramkit.core.run.settling.plan_request_from_config import plan_request
from vramkit.finetune_options import FinetuneOptions

BLOCKS = 6
_SMALL = "hidden_size: 64, intermediate_size: 128, num_attention_heads: 4, vocab_size: 512"
SHRUNK = {
    "meta-llama/Llama-3.2-1B": f"{{num_hidden_layers: {BLOCKS}, num_key_value_heads: 2, {_SMALL}}}",
    "gpt2": f"{{n_layer: {BLOCKS}, n_embd: 64, n_head: 4, vocab_size: 512}}",
    "microsoft/phi-1_5": f"{{num_hidden_layers: {BLOCKS}, {_SMALL}}}",
    "EleutherAI/pythia-160m": f"{{num_hidden_layers: {BLOCKS}, {_SMALL}}}",
}
"""Shipped configs cut to `BLOCKS` blocks and a small width (`model.config_overrides`)."""
PHASES = ((TRAIN, 1), (TRAIN, 3), (VAL, 1), (VAL, 3), (INFERENCE, 2))


def _planner(name: str, method: str, checkpointing: bool, precision: str | None):
    lora = FinetuneOptions(method=method, lora_r=None if method == "full" else 4)
    common = FinetuneOptions(gradient_checkpointing=checkpointing, precision=precision).check()
    overrides = hf_overrides(name, hw="rtx4090_laptop", seq_len=16, finetune=lora)
    overrides += [*common.common_overrides(), f"model.config_overrides={SHRUNK[name]}"]
    try:
        cfg = compose_config("train", overrides)
        request = plan_request(
            cfg, load_profile("rtx4090_laptop"), batch_sizes=(1, 1), with_remedies=False
        )
    finally:
        forget_composition()
    return task_planner(request), request.setup


def _assert_rebuilt_equal(name, method, checkpointing, precision, *, fall_back=0):
    rebuilt, setup = _planner(name, method, checkpointing, precision)
    full, _ = _planner(name, method, checkpointing, precision)
    full.extrapolate_blocks = False
    for phase, size in PHASES:
        assert rebuilt.measure(phase, size, setup) == full.measure(phase, size, setup)
    assert rebuilt.rebuilt_traces == len(PHASES) - fall_back
    assert full.rebuilt_traces == 0


def test_llama_qlora_with_checkpointing_is_rebuilt_exactly():
    _assert_rebuilt_equal("meta-llama/Llama-3.2-1B", "qlora", True, None)


@pytest.mark.slow
def test_gpt2_full_bf16_true_is_rebuilt_exactly():
    _assert_rebuilt_equal("gpt2", "full", False, "bf16-true")


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "method", "checkpointing", "precision"),
    [
        ("microsoft/phi-1_5", "lora", True, None),
        ("EleutherAI/pythia-160m", "lora", False, "bf16-true"),
        ("EleutherAI/pythia-160m", "full", True, None),
        ("meta-llama/Llama-3.2-1B", "full", False, "bf16-true"),
        ("gpt2", "lora", True, None),
    ],
)
def test_more_families_are_rebuilt_exactly(name, method, checkpointing, precision):
    _assert_rebuilt_equal(name, method, checkpointing, precision)


@pytest.mark.slow
def test_a_first_call_that_changes_the_model_falls_back_then_rebuilds():
    # bitsandbytes converts a 4-bit layer's bias to the input's dtype on its first call: the
    # first training plan's short traces do not repeat (block 2 converts, blocks 0-1 did), so
    # the whole model is traced, as it would be without them; later plans rebuild.
    _assert_rebuilt_equal("microsoft/phi-1_5", "qlora", False, "bf16-true", fall_back=1)
