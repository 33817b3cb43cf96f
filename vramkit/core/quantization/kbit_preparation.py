"""peft's `prepare_model_for_kbit_training`, applied alike to a bitsandbytes-quantized model (the
``qlora`` run of ``task=causal_lm``) and to the planner's (meta or fake) model.

peft's function (`peft/utils/other.py`, peft 0.21) needs a model loaded by transformers in 4 or
8 bits; the planner's model holds `PlannedQuantizedLinear` stand-ins instead, so this module does
the same to either: every parameter is frozen; every fp16 or bf16 parameter that is not a
quantized weight (norms, embeddings, an unquantized ``lm_head``, biases) becomes fp32
(``param.data = param.data.to(torch.float32)``, which skips `Params4bit`, whose packed weight is
uint8, and leaves int8 weights alone since they are neither dtype); with reentrant gradient
checkpointing the input embeddings' output requires grad (``model.enable_input_require_grads()``)
so that a checkpointed first block back-propagates into its adapters (peft skips it when
``use_reentrant=False``). Turning gradient checkpointing on is the planner's `RunSetup`
(non-reentrant).

A QLoRA run's fp32 norms make every 4-bit layer's input fp32 (Llama's RMSNorm multiplies an fp32
weight by the bf16 input), and `Linear4bit` casts its output back to that dtype: see
:mod:`vramkit.core.quantization.planned_linear`.
"""

from __future__ import annotations

import torch
from torch import nn

from vramkit.core.quantization.planned_linear import PlannedQuantizedLinear

_HALF = (torch.float16, torch.bfloat16)


def prepare_for_kbit_training(model: nn.Module, *, gradient_checkpointing: bool = True) -> int:
    """Do to `model` what peft's ``prepare_model_for_kbit_training`` does to a quantized model;
    return how many parameters were cast to fp32. Call it after `plan_quantized_linears` (or
    bitsandbytes' quantization) and before adding the LoRA adapters, as peft's QLoRA recipe does;
    `gradient_checkpointing` is True for reentrant checkpointing only (peft's input-grad hook)."""
    quantized = {
        id(module.weight)
        for module in model.modules()
        if isinstance(module, PlannedQuantizedLinear)
    }
    cast = 0
    for param in model.parameters():
        param.requires_grad = False
        if param.dtype in _HALF and id(param) not in quantized:
            param.data = param.data.to(torch.float32)
            cast += 1
    if gradient_checkpointing and hasattr(model, "enable_input_require_grads"):
        model.enable_input_require_grads()
    return cast
