"""Real bitsandbytes quantization of a model's Linear layers (QLoRA's frozen 4-bit base, or 8-bit).

The planner's counterpart, for a model built on the meta device, is
:func:`vramkit.core.quantization.planned_linear.plan_quantized_linears`: the same arguments, but
stand-ins that only hold and allocate what these layers do.

What transformers' ``BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=…,
bnb_4bit_use_double_quant=…, bnb_4bit_compute_dtype=…)`` builds is a ``bnb.nn.Linear4bit`` with
``quant_type``, ``compress_statistics`` (double quantization) and ``compute_dtype``
(transformers ``integrations/bitsandbytes.py``, ``replace_with_bnb_linear``); the weight is
quantized when the layer is moved to its device (``Params4bit._quantize`` in bitsandbytes
``nn/modules.py``), which bitsandbytes >= 0.50 also does on the CPU (its CPU backend).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from vramkit.core.optional_dependency import import_optional

QUANT_TYPES = ("nf4", "fp4")
"""bitsandbytes' 4-bit data types (``Linear4bit(quant_type=…)``)."""


def quantize_linears(
    linears: Iterable[tuple[nn.Module, str, nn.Linear]],
    kind: str,
    *,
    quant_type: str = "nf4",
    double_quant: bool = True,
    compute_dtype: torch.dtype | None = None,
    purpose: str = "a quantized model",
) -> int:
    """Replace each ``(parent, name, layer)`` Linear layer by a bitsandbytes layer holding the
    same weight in `kind` ("4bit" or "8bit"), on the layer's device; return how many.

    4-bit: ``quant_type`` "nf4" or "fp4", ``double_quant`` (bitsandbytes' ``compress_statistics``),
    ``compute_dtype`` (the matmul's dtype; None: the weight's). 8-bit: ``Linear8bitLt`` with
    ``has_fp16_weights=False`` (int8 weights, frozen). Only for real weights: the meta device has
    none to quantize. ``purpose`` names what needs bitsandbytes when it is not installed.
    """
    if kind == "4bit" and quant_type not in QUANT_TYPES:
        raise ValueError(f"quant_type must be one of {QUANT_TYPES}, got {quant_type!r}")
    bnb = import_optional("bitsandbytes", extra="bnb", purpose=purpose)
    replaced = 0
    for parent, name, child in linears:
        has_bias = child.bias is not None
        if kind == "4bit":
            layer = bnb.nn.Linear4bit(
                child.in_features,
                child.out_features,
                bias=has_bias,
                compute_dtype=compute_dtype or child.weight.dtype,
                compress_statistics=double_quant,
                quant_type=quant_type,
            )
        elif kind == "8bit":
            layer = bnb.nn.Linear8bitLt(
                child.in_features, child.out_features, bias=has_bias, has_fp16_weights=False
            )
        else:
            raise ValueError(f"unknown quantization {kind!r}; 4bit or 8bit")
        layer.load_state_dict(child.state_dict())
        setattr(parent, name, layer.to(child.weight.device))  # bitsandbytes quantizes on .to()
        replaced += 1
    return replaced


def restore_4bit_weights(model: nn.Module, state_dict: dict[str, torch.Tensor]) -> int:
    """Make `state_dict` (of `model`, e.g. a checkpoint's) loadable into `model`'s 4-bit layers;
    return how many layers it restored.

    bitsandbytes saves a ``Linear4bit``'s quantization state beside its packed weight
    (``<layer>.weight.absmax``, ``.quant_map``, ``.nested_*``, ``.quant_state.bitsandbytes__nf4``;
    ``Linear4bit._save_to_state_dict``) but ``load_state_dict`` does not read it back: those keys
    are unexpected. As transformers' loader does, each layer's weight is rebuilt from them with
    ``Params4bit.from_prequantized`` and the keys are taken out of `state_dict`; the packed weight
    stays, so a strict load then copies it into the rebuilt one.
    """
    bnb = import_optional("bitsandbytes", extra="bnb", purpose="a 4-bit checkpoint")
    restored = 0
    for name, module in model.named_modules():
        if not isinstance(module, bnb.nn.Linear4bit):
            continue
        key = f"{name}.weight"
        stats = {
            saved[len(key) + 1 :]: state_dict.pop(saved)
            for saved in list(state_dict)
            if saved.startswith(f"{key}.")
        }
        if not stats or key not in state_dict:
            continue
        module.weight = bnb.nn.Params4bit.from_prequantized(
            data=state_dict[key],
            quantized_stats=stats,
            requires_grad=False,
            device=module.weight.device,
            module=module,
        )
        restored += 1
    return restored
