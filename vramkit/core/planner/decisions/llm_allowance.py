"""The allowance a parameter-efficient fine-tune of a causal LM (LoRA, QLoRA) plans on top of
its traced activations, and how the planner knows a model is one.

A model is such a fine-tune (`is_adapter_causal_lm`) when it holds a causal language model, a
module whose class name ends in ``ForCausalLM`` (transformers' naming for every causal-LM head,
peft's wrapper included) or one with an ``lm_head`` module (LitGPT's ``GPT``, nanoGPT), and its
base is frozen or quantized: 4-bit / 8-bit stand-ins (`PlannedQuantizedLinear`), or fewer than
half of its parameters trainable (adapters). Full fine-tunes, classifiers with LoRA and every
other model are planned without the allowance: it was measured on adapter fine-tunes only.
"""

from __future__ import annotations

import math

from torch import nn

from vramkit.core.quantization.planned_linear import PlannedQuantizedLinear

LLM_ALLOWANCE = "llm_activation_allowance"
"""The category of a plan's `allocated` that holds the allowance (only where it applies)."""

LLM_ACTIVATION_ALLOWANCE = 0.15
"""Bytes an adapter fine-tune of a causal LM plans per byte of activations its training step
holds at the peak, on top of them, on a CUDA device. Measured on the 14 LitGPT LoRA / QLoRA cases
of the field benchmark (`benchmarks/field_cases/litgpt_*.json`, from Lit-GPT commit 8641822's
`tutorials/resource-tables.md`: torch 2.1.0, bitsandbytes 0.41.1, A100 40GB, bf16-true, phi-1.5,
StableLM Alpha 3B and Llama 2 7B at micro-batch 1-4).

What is explained, and no longer carried here: Lightning Fabric casts every floating-point output
of the module it set up to the default dtype (`_FabricModule.forward` -> `convert_output`,
``dst_type=torch.get_default_dtype()``, src/lightning/fabric/plugins/precision/half.py and
bitsandbytes.py), so LitGPT's logits and its cross entropy are fp32 and, as the forward returns,
the bf16 chunks and their fp32 copies are live beside the previous micro-batch's kept logits; and
LitGPT applies the lm_head and the loss to 128-token chunks (lit_gpt/lora.py ``GPT.forward``,
lit_gpt/utils.py ``chunked_cross_entropy``). The replica now replays both
(`benchmarks/llm_replica.py`: ``output_dtype``, ``lm_head_chunk_tokens``): that is 40% of the
LoRA gap on phi-1.5 and StableLM 3B and 10% on Llama 2 7B, whose logits are a smaller share.

What is left (the plan without the allowance reads below the measurement by): for LoRA 0.075-0.104
of the traced activations, the same share at micro-batch 1, 2 and 4 (so it grows with the tokens,
not the model states or the allocator's per-block rounding, which would not scale), 1.2-2.1 bf16
vectors of the model width per token per layer; for QLoRA 0.11-0.19, whose excess over the same
model's LoRA gap is one bf16 copy of the 4-bit lm_head's weight to within 0.02-0.05 GiB on all
three models (LitGPT quantizes the lm_head; its cause is not found: the 4-bit stand-in already
dequantizes that weight in forward and backward). Read in LitGPT's code and found not to be it:
the merged-QKV LoRA's ``zero_pad`` output (its ``index_copy`` and the scaling save nothing); the
fp16 rotary cache (``x * cos`` promotes to fp32 but saves only ``cos``); LoRA dropout (LitGPT
drops the shared qkv input once, peft twice for q and v: the replica holds 1.5 vectors per layer
more, not less); bitsandbytes 0.41.1 keeping each 4-bit layer's input (already a rule). LitGPT's
own model code differs from the transformers replica the other way on Llama (its RMSNorm keeps
no fp32 copy) and by +2 vectors per layer on all (flash attention saves ``v`` as a view of the
whole fused qkv): not replayed, and not enough to explain the rest. So the plan carries 0.15:
every LitGPT case then plans between 2.1% low and 4.4% high; the torchtune cases
(`benchmarks/field_cases/torchtune_*.json`, activation checkpointing, their own model code),
where it is only 0.08-0.21 GiB, read -4.6% (Llama 3 8B, a 128,256-token vocabulary) to +2.0%
with it and -5.7% to +1.5% without. 0.13 would leave that case 4.8% low, too near the 5% limit
for cases not seen."""


def is_adapter_causal_lm(module: nn.Module) -> bool:
    """Whether `module` holds a causal LM fine-tuned through adapters or quantized layers (see
    the module docstring)."""
    causal = any(
        type(sub).__name__.endswith("ForCausalLM")
        or isinstance(getattr(sub, "lm_head", None), nn.Module)
        for sub in module.modules()
    )
    if not causal:
        return False
    if any(isinstance(sub, PlannedQuantizedLinear) for sub in module.modules()):
        return True
    total = trainable = 0
    for param in module.parameters():
        total += param.numel()
        trainable += param.numel() if param.requires_grad else 0
    return 0 < trainable < total / 2


def llm_activation_allowance(activations: int) -> int:
    """The allowance for `activations` bytes of traced activations at a training peak (bytes)."""
    return math.ceil(activations * LLM_ACTIVATION_ALLOWANCE)
