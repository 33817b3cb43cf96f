"""What a causal-LM fine-tune trains: every weight (``full``), LoRA adapters (``lora``) or LoRA
adapters over a frozen 4-bit base (``qlora``), through peft and bitsandbytes.

``model.finetune`` picks the method, ``model.lora`` the adapters (peft's ``LoraConfig``: ``r``,
``lora_alpha``, ``lora_dropout``, ``target_modules``, where ``all-linear`` is every Linear layer
but the output layer, peft ``tuners/tuners_utils.py``, ``_maybe_include_all_linear_layers``) and
``model.qlora`` the 4-bit base (transformers' ``BitsAndBytesConfig``: ``bnb_4bit_quant_type``,
``bnb_4bit_use_double_quant``, ``bnb_4bit_compute_dtype``). As transformers does for a 4-bit
model, every Linear layer but the output layer (``lm_head``) is quantized (transformers
``integrations/bitsandbytes.py``: ``get_keys_to_not_convert`` keeps the output embeddings).

On the meta device (the memory planner's build) nothing can be quantized: the layers become
`PlannedQuantizedLinear` stand-ins that hold and allocate what bitsandbytes' layers do.

A ``qlora`` model is then prepared as peft's QLoRA recipe prepares it, between quantization and
the adapters (``prepare_model_for_kbit_training``, peft ``utils/other.py``): every parameter
frozen and every fp16/bf16 one that is not a 4-bit weight (norms, embeddings, ``lm_head``,
biases) cast to fp32, by `kbit_preparation.prepare_for_kbit_training`, which does the same to the
real model and to the planner's, so that plan and run hold the same dtypes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

import torch
from pydantic import Field
from torch import nn

from vramkit.core.config.schema import ConfigError
from vramkit.core.config.settings import Settings
from vramkit.core.config.source import closest, source_of
from vramkit.core.optional_dependency import import_optional
from vramkit.core.quantization.bnb_layers import quantize_linears
from vramkit.core.quantization.kbit_preparation import prepare_for_kbit_training
from vramkit.core.quantization.planned_linear import plan_quantized_linears

METHODS = ("full", "lora", "qlora")
"""``model.finetune``: every weight, LoRA adapters, or LoRA adapters over a 4-bit base."""
ALL_LINEAR = "all-linear"
"""``model.lora.target_modules``: every Linear layer but the output layer (peft's shorthand)."""
COMPUTE_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class LoraSettings(Settings):
    """``model.lora``: the adapters of a ``lora`` or ``qlora`` fine-tune."""

    r: int = Field(16, gt=0)
    """Adapter rank."""
    alpha: float = Field(32.0, gt=0)
    """Adapters add (alpha / r) · B·A·x."""
    dropout: float = Field(0.05, ge=0, lt=1)
    """Dropout on the adapters' input."""
    target_modules: list[str] | Literal["all-linear"] = ALL_LINEAR
    """Names of the Linear layers that get adapters, or all-linear."""

    def cross_field_problems(self) -> list[tuple[str, str]]:
        if not self.target_modules:
            return [("target_modules", "must name at least one Linear layer, or all-linear")]
        return []


class QLoraSettings(Settings):
    """``model.qlora``: how a ``qlora`` fine-tune stores its frozen base Linear layers."""

    quant_type: Literal["nf4", "fp4"] = "nf4"
    """4-bit data type: NormalFloat4 (QLoRA's) or plain FP4."""
    double_quant: bool = True
    """Quantize the quantization constants again (about 0.37 bit per weight saved)."""
    compute_dtype: Literal["float32", "bfloat16", "float16"] = "bfloat16"
    """The dtype the 4-bit layers compute in (their weights are dequantized to it)."""

    @property
    def torch_compute_dtype(self) -> torch.dtype:
        """``compute_dtype`` as a torch dtype."""
        return COMPUTE_DTYPES[self.compute_dtype]


def check_method(method: str) -> str:
    """`method` (``model.finetune``) when it is one of `METHODS`; else a `ConfigError`."""
    if method not in METHODS:
        near = closest(str(method), list(METHODS))
        hint = f"; did you mean {near}?" if near else ""
        raise ConfigError(
            f"invalid model settings ({source_of('model').file}):\n"
            f"  model.finetune: {method!r} is not one of {', '.join(METHODS)}{hint}",
            ("finetune",),
        )
    return method


def lora_settings(values: Mapping[str, Any] | None) -> LoraSettings:
    """``model.lora`` checked (defaults when null); a bad key is a `ConfigError`."""
    return LoraSettings.from_config(
        values or {}, key_prefix="model.lora.", source=source_of("model")
    )


def qlora_settings(values: Mapping[str, Any] | None) -> QLoraSettings:
    """``model.qlora`` checked (defaults when null); a bad key is a `ConfigError`."""
    return QLoraSettings.from_config(
        values or {}, key_prefix="model.qlora.", source=source_of("model")
    )


def _output_layer(model: nn.Module) -> nn.Module | None:
    get = getattr(model, "get_output_embeddings", None)
    return get() if callable(get) else None


def base_linears(model: nn.Module) -> list[tuple[nn.Module, str, nn.Linear]]:
    """Every plain Linear layer of `model` but its output layer: ``(parent, name, layer)``."""
    output = _output_layer(model)
    return [
        (parent, name, child)
        for parent in model.modules()
        for name, child in parent.named_children()
        if type(child) is nn.Linear and child is not output
    ]


def conv1d_as_linear(model: nn.Module) -> int:
    """Replace transformers' ``Conv1D`` layers (GPT-2's: y = x·W + b, W stored in × out) by the
    equal ``nn.Linear`` (W transposed); return how many.

    LoRA target names and 4-bit storage then see them as the Linear layers they are, as
    transformers' bitsandbytes integration treats them (``integrations/bitsandbytes.py``,
    ``replace_with_bnb_linear``: a ``Conv1D`` becomes a ``Linear4bit`` of the transposed shape).
    """
    conv1d = import_optional("transformers", extra="nlp", purpose="task=causal_lm").Conv1D
    replaced = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if not isinstance(child, conv1d):
                continue
            in_features, out_features = child.weight.shape
            weight = child.weight
            linear = nn.Linear(
                in_features,
                out_features,
                bias=child.bias is not None,
                device=weight.device,
                dtype=weight.dtype,
            )
            if not weight.is_meta:  # the planner's meta build has no values to copy
                with torch.no_grad():
                    linear.weight.copy_(weight.t())
                    if child.bias is not None:
                        linear.bias.copy_(child.bias)
            setattr(parent, name, linear)
            replaced += 1
    return replaced


def check_target_modules(model: nn.Module, settings: LoraSettings) -> None:
    """Refuse a target module name no Linear layer of the base model has, naming the closest."""
    if settings.target_modules == ALL_LINEAR:
        return
    names = {name for _, name, _ in base_linears(model)}
    for target in settings.target_modules:
        if target not in names:
            hint = closest(target, sorted(names))
            suggestion = f"; did you mean {hint}?" if hint else ""
            raise ConfigError(
                f"invalid model.lora settings ({source_of('model').file}):\n"
                f"  model.lora.target_modules: {target!r} is no Linear layer of "
                f"{type(model).__name__}{suggestion} (its Linear layers: "
                f"{', '.join(sorted(names))}, or all-linear)",
                ("target_modules",),
            )


def _is_meta(model: nn.Module) -> bool:
    return any(p.is_meta for p in model.parameters())


def quantize_base(model: nn.Module, settings: QLoraSettings) -> int:
    """Store every base Linear layer of `model` in 4 bits as `settings` say; how many layers.

    Real weights are quantized by bitsandbytes; on the meta device the layers become the
    planner's stand-ins with the same settings.
    """
    linears = base_linears(model)
    options = {
        "quant_type": settings.quant_type,
        "double_quant": settings.double_quant,
        "compute_dtype": settings.torch_compute_dtype,
    }
    if _is_meta(model):
        return plan_quantized_linears(linears, "4bit", **options)
    replaced = quantize_linears(linears, "4bit", purpose="model.finetune=qlora", **options)
    # What transformers sets on a 4-bit model; peft then wraps the layers with its bnb adapters.
    model.is_loaded_in_4bit = True
    return replaced


def apply_finetune(
    model: nn.Module, method: str, lora: LoraSettings, qlora: QLoraSettings
) -> nn.Module:
    """`model` ready for `method`: unchanged for ``full``; frozen with LoRA adapters (peft) for
    ``lora``; for ``qlora`` its base Linear layers stored in 4 bits and the model prepared for
    k-bit training first (`prepare_for_kbit_training`). Under both, GPT-2's ``Conv1D`` layers
    become the equal Linear layers first (`conv1d_as_linear`)."""
    if check_method(method) == "full":
        return model
    peft = import_optional("peft", extra="nlp", purpose=f"model.finetune={method}")
    conv1d_as_linear(model)
    check_target_modules(model, lora)
    if method == "qlora":
        quantize_base(model, qlora)
        # peft adds its input-grad hook only for reentrant checkpointing ("When having
        # `use_reentrant=False` + gradient_checkpointing, there is no need for this hack");
        # vramkit's checkpointing is non-reentrant (module._enable_checkpointing).
        prepare_for_kbit_training(model, gradient_checkpointing=False)
    config = peft.LoraConfig(
        task_type=peft.TaskType.CAUSAL_LM,
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=lora.target_modules
        if lora.target_modules == ALL_LINEAR
        else list(lora.target_modules),
    )
    return peft.get_peft_model(model, config)
