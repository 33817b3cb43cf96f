"""LoRA / QLoRA for the Hugging Face classifier (``model.lora``), through peft and bitsandbytes.

With ``model.lora`` set, the base model's weights are frozen, the Linear layers named in
``target_modules`` get low-rank adapters (peft's `LoraConfig`) and the classification head
(``score`` for Phi, ``classifier`` for BERT-likes) is trained in full: peft keeps a trainable copy
of it (``modules_to_save``). ``quantize`` additionally stores every frozen Linear weight of the
base model (not the head) as bitsandbytes 4-bit NF4 (QLoRA) or 8-bit (LLM.int8()).

bitsandbytes >= 0.50 quantizes and runs those layers on the CPU too (its CPU backend), so a
quantized run works on this machine, only slowly. Under the meta device (the memory planner
builds the model there) nothing can be quantized: the layers stay plain Linear layers, and the
planner gets `PlannedQuantizedLinear` stand-ins that hold and allocate what bitsandbytes would.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import Field
from torch import nn

from vramkit.core.config.schema import ConfigError
from vramkit.core.config.settings import Settings
from vramkit.core.config.source import closest, source_of
from vramkit.core.optional_dependency import import_optional
from vramkit.core.quantization.bnb_layers import quantize_linears
from vramkit.core.quantization.planned_linear import plan_quantized_linears

# Heads of AutoModelForSequenceClassification models: trained in full, never quantized.
HEAD_NAMES = ("score", "classifier")


class LoraSettings(Settings):
    """``model.lora``: the adapters and how the frozen base weights are stored."""

    r: int = Field(16, gt=0)
    """Adapter rank."""
    alpha: float = Field(32.0, gt=0)
    """Adapters add (alpha / r) · B·A·x."""
    dropout: float = Field(0.0, ge=0, lt=1)
    """Dropout on the adapters' input."""
    target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "dense")
    """Names of the Linear layers that get adapters."""
    quantize: Literal["4bit", "8bit"] | None = None
    """Frozen base Linear weights in bitsandbytes 4-bit NF4 or 8-bit; None keeps their dtype."""

    def cross_field_problems(self) -> list[tuple[str, str]]:
        if not self.target_modules:
            return [("target_modules", "must name at least one Linear layer")]
        return []


def lora_settings(values: Mapping[str, Any] | None) -> LoraSettings | None:
    """`values` (``model.lora``) checked; None when LoRA is off. A bad key is a `ConfigError`."""
    if values is None:
        return None
    return LoraSettings.from_config(values, key_prefix="model.lora.", source=source_of("model"))


def head_name(model: nn.Module) -> str:
    """The attribute name of the classifier's head (``score`` for Phi)."""
    for name in HEAD_NAMES:
        if isinstance(getattr(model, name, None), nn.Module):
            return name
    raise ValueError(
        f"{type(model).__name__} has none of the heads {HEAD_NAMES}: LoRA cannot tell which "
        "module to train in full"
    )


def _linear_names(model: nn.Module, head: str) -> set[str]:
    return {
        name.rsplit(".", 1)[-1]
        for name, module in model.named_modules()
        if isinstance(module, nn.Linear) and name.split(".", 1)[0] != head
    }


def check_target_modules(model: nn.Module, settings: LoraSettings) -> None:
    """Refuse a target module name no Linear layer of the base model has, naming the closest."""
    names = _linear_names(model, head_name(model))
    for target in settings.target_modules:
        if target not in names:
            hint = closest(target, sorted(names))
            suggestion = f"; did you mean {hint}?" if hint else ""
            layers = ", ".join(sorted(names))
            raise ConfigError(
                f"invalid model.lora settings ({source_of('model').file}):\n"
                f"  model.lora.target_modules: {target!r} is no Linear layer of "
                f"{type(model).__name__}{suggestion} (its Linear layers: {layers})",
                ("target_modules",),
            )


def _is_meta(model: nn.Module) -> bool:
    return any(p.is_meta for p in model.parameters())


def base_linears(model: nn.Module) -> list[tuple[nn.Module, str, nn.Linear]]:
    """Every plain Linear layer of the base model, not the head: ``(parent, name, layer)``."""
    head = head_name(model)
    found = []
    for parent_name, parent in model.named_modules():
        if parent_name.split(".", 1)[0] == head:
            continue
        for name, child in parent.named_children():
            if type(child) is nn.Linear and not (parent is model and name == head):
                found.append((parent, name, child))
    return found


def quantize_base_linears(model: nn.Module, kind: str) -> int:
    """Replace every Linear layer of `model` but its head by a bitsandbytes layer holding the
    same weight in `kind` ("4bit" NF4 or "8bit"); return how many were replaced.

    The weights are quantized where they are (on the CPU here; a later move to CUDA moves the
    quantized data). Only for a model with real weights: the meta device has none to quantize.
    """
    return quantize_linears(base_linears(model), kind, purpose="model.lora.quantize")


def add_lora(model: nn.Module, settings: LoraSettings) -> nn.Module:
    """`model` with frozen base weights, LoRA adapters on `settings.target_modules` and a
    trainable head; quantized first when `settings.quantize` asks for it (not on meta)."""
    peft = import_optional("peft", extra="nlp", purpose="model.lora")
    check_target_modules(model, settings)
    head = head_name(model)
    if settings.quantize is not None:
        if _is_meta(model):  # the memory planner's build: nothing to quantize, only to count
            plan_quantized_linears(base_linears(model), settings.quantize)
        else:
            quantize_base_linears(model, settings.quantize)
    config = peft.LoraConfig(
        task_type=peft.TaskType.SEQ_CLS,
        r=settings.r,
        lora_alpha=settings.alpha,
        lora_dropout=settings.dropout,
        target_modules=list(settings.target_modules),
        modules_to_save=[head],
    )
    return peft.get_peft_model(model, config)
