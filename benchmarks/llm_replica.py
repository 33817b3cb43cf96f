"""An LLM fine-tune as a published recipe runs it, rebuilt for the planner: full, LoRA or QLoRA.

The field benchmark's LLM cases (``benchmarks/field_cases/*.json`` with a ``model.llm`` block)
are replayed with this LightningModule: the Hugging Face causal LM of `HFModelModule`, then, in
the recipe's order,

1. its weights in the dtype the recipe loads them in (``load_dtype``: ``from_pretrained(
   torch_dtype=…)``);
2. quantization (``quantization``): the Linear layers the recipe quantizes become
   `PlannedQuantizedLinear` stand-ins (bitsandbytes 4-bit NF4/FP4 with or without double
   quantization and a compute dtype, or 8-bit), with the rules of the bitsandbytes release the
   replay states (`bitsandbytes_rules_of`, from the case's ``frameworks.bitsandbytes``);
3. peft's ``prepare_model_for_kbit_training`` (``kbit_preparation``);
4. LoRA adapters (``lora``: peft's `LoraConfig` with ``r``, ``alpha``, ``dropout`` and
   ``target_modules``, in fp32 as peft creates them, or in the recipe's ``adapter_dtype``).

``loss_in_logits_dtype`` computes the loss as LitGPT's ``chunked_cross_entropy`` does: a cross
entropy on the logits in their own dtype (bf16 under ``bf16-true``), where transformers' loss
first upcasts them to fp32 (`ForCausalLMLoss`: ``logits = logits.float()``).
``logits_kept_to_next_step`` keeps the logits alive as LitGPT's training loop does: its
``logits = model(input_ids, lm_head_chunk_size=128)`` is a loop variable, so one micro-batch's
logits live through its backward and the optimizer step until the next forward returns
(finetune/lora.py lines 216-220 of Lit-GPT commit 8641822).

``lm_head_chunk_tokens`` applies the output layer to chunks of that many positions and computes
one unreduced cross entropy per chunk, as LitGPT does (``GPT.forward(lm_head_chunk_size=128)``
in lit_gpt/lora.py and ``chunked_cross_entropy`` in lit_gpt/utils.py of commit 8641822): the
backward of the loss then holds one chunk's gradients at a time, not the whole [B, T, V].
``output_dtype`` casts the logits the model returns, as Lightning Fabric's precision plugins do
to every floating-point output of a module set up with ``fabric.setup_module``:
``_FabricModule.forward`` (src/lightning/fabric/wrappers.py) calls ``precision.convert_output``,
which for ``bf16-true`` (`HalfPrecision`, src/lightning/fabric/plugins/precision/half.py) and
for `BitsandbytesPrecision` (.../precision/bitsandbytes.py) casts to
``torch.get_default_dtype()``, fp32. So LitGPT's logits are fp32 from the model's return on:
the bf16 chunks and their fp32 copies are both live as the forward returns, and the kept logits
and the loss' saved log-softmax are fp32.

``keep_dtypes`` keeps every tensor's dtype when the planner makes the model fake (a recipe
trained under ``bf16-mixed`` whose base weights are bf16 and adapters fp32); otherwise the
precision decides, as Lightning's ``*-true`` precisions do.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from vramkit.core.quantization.kbit_preparation import prepare_for_kbit_training
from vramkit.core.quantization.planned_linear import plan_quantized_linears
from vramkit.tasks.hf_models.module import HFModelModule

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def quantized_linears(
    model: nn.Module, skip: tuple[str, ...]
) -> list[tuple[nn.Module, str, nn.Linear]]:
    """Every plain Linear layer of `model` whose name is not in `skip` (transformers'
    ``llm_int8_skip_modules``; by default it keeps ``lm_head`` unquantized)."""
    found = []
    for _, parent in model.named_modules():
        for name, child in parent.named_children():
            if type(child) is nn.Linear and name not in skip:
                found.append((parent, name, child))
    return found


class LLMReplicaModule(HFModelModule):
    """`HFModelModule` for ``causal_lm`` with a recipe's dtype, quantization, kbit preparation and
    LoRA applied (see the module docstring)."""

    def __init__(
        self,
        *,
        load_dtype: str | None = None,
        quantization: Mapping[str, Any] | None = None,
        kbit_preparation: bool = False,
        lora: Mapping[str, Any] | None = None,
        keep_dtypes: bool = False,
        loss_in_logits_dtype: bool = False,
        logits_kept_to_next_step: bool = False,
        lm_head_chunk_tokens: int = 0,
        output_dtype: str | None = None,
        **hf_module: Any,
    ) -> None:
        super().__init__(**hf_module)
        self.loss_in_logits_dtype = loss_in_logits_dtype
        self.logits_kept_to_next_step = logits_kept_to_next_step
        self.lm_head_chunk_tokens = lm_head_chunk_tokens
        self.output_dtype = DTYPES[output_dtype] if output_dtype else None
        self.kept_logits: list[torch.Tensor] | None = None
        model = self.model
        if load_dtype is not None:
            model.to(DTYPES[load_dtype])
        if quantization is not None:
            _quantize(model, dict(quantization))
        if kbit_preparation:
            prepare_for_kbit_training(model, gradient_checkpointing=False)
        if lora is not None:
            self.model = _add_lora(model, dict(lora))
        self.keeps_own_dtypes = keep_dtypes

    def _step(self, batch: Mapping[str, torch.Tensor], phase: str) -> torch.Tensor:
        if not self.loss_in_logits_dtype:
            return super()._step(batch, phase)
        inputs = {key: batch[key] for key in ("input_ids", "attention_mask") if key in batch}
        chunks = self._logit_chunks(inputs)
        if self.output_dtype is not None:
            # Fabric's `convert_output`: every chunk is cast while the list of bf16 ones is
            # still referenced, so both are live as the forward returns.
            chunks = [chunk.to(self.output_dtype) for chunk in chunks]
        if self.logits_kept_to_next_step:
            # Replaced only now, after the forward, as the recipe's loop variable is.
            self.kept_logits = chunks
        labels = batch["labels"]
        # Next-token targets shifted on the label side: the logits are not copied.
        targets = torch.cat([labels[:, 1:], labels.new_full((labels.shape[0], 1), -100)], dim=1)
        if self.lm_head_chunk_tokens:
            # `chunked_cross_entropy`: one unreduced loss per chunk, then their mean.
            parts = targets.split(self.lm_head_chunk_tokens, dim=1)
            losses = [
                F.cross_entropy(chunk.flatten(0, 1), part.flatten(), reduction="none")
                for chunk, part in zip(chunks, parts, strict=True)
            ]
            loss = torch.cat(losses).mean()
        else:
            (logits,) = chunks
            loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-100)
        self.log(f"{phase}/loss", loss.detach(), batch_size=labels.shape[0])
        return loss

    def _logit_chunks(self, inputs: Mapping[str, torch.Tensor]) -> list[torch.Tensor]:
        """The logits, whole or as LitGPT's ``lm_head_chunk_size`` makes them ([B, n, V] each)."""
        if not self.lm_head_chunk_tokens:
            return [self.model(**inputs).logits]
        causal_lm = (
            self.model.get_base_model() if hasattr(self.model, "get_base_model") else self.model
        )
        hidden = causal_lm.get_decoder()(**inputs).last_hidden_state
        head = causal_lm.get_output_embeddings()
        return [head(part) for part in hidden.split(self.lm_head_chunk_tokens, dim=1)]


def _quantize(model: nn.Module, settings: dict[str, Any]) -> None:
    skip = tuple(settings.pop("skip_modules", ("lm_head",)))
    compute = settings.pop("compute_dtype", None)
    kind = settings.pop("kind")
    options = {
        "quant_type": settings.pop("quant_type", "nf4"),
        "double_quant": settings.pop("double_quant", True),
        "compute_dtype": DTYPES[compute] if compute else None,
    }
    if settings:
        raise ValueError(f"unknown quantization settings {sorted(settings)}")
    plan_quantized_linears(quantized_linears(model, skip), kind, **options)


def _add_lora(model: nn.Module, settings: dict[str, Any]) -> nn.Module:
    import peft

    adapter_dtype = settings.pop("adapter_dtype", None)
    config = peft.LoraConfig(
        task_type=peft.TaskType.CAUSAL_LM,
        r=settings.pop("r"),
        lora_alpha=settings.pop("alpha"),
        lora_dropout=settings.pop("dropout", 0.0),
        target_modules=settings.pop("target_modules"),
    )
    if settings:
        raise ValueError(f"unknown lora settings {sorted(settings)}")
    wrapped = peft.get_peft_model(model, config)
    if adapter_dtype is not None:
        for name, param in wrapped.named_parameters():
            if "lora_" in name:
                param.data = param.data.to(DTYPES[adapter_dtype])
    return wrapped
