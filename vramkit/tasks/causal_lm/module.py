"""Supervised fine-tuning of a causal language model as a LightningModule."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from vramkit.core.oom.resilient_module import OOMResilientModule
from vramkit.core.optim.scheduled_module import OptimizerFactory, ScheduledOptimization
from vramkit.core.quantization.bnb_layers import restore_4bit_weights
from vramkit.tasks.causal_lm.finetune import (
    apply_finetune,
    check_method,
    lora_settings,
    qlora_settings,
)
from vramkit.tasks.causal_lm.lm_builder import build_causal_lm

IGNORE_INDEX = -100
"""A label that takes no part in the loss (the prompt's tokens, padding)."""
_NON_REENTRANT = {"use_reentrant": False}


def _enable_checkpointing(model: torch.nn.Module) -> None:
    # Non-reentrant: works with frozen inputs (LoRA) without making the embeddings' outputs
    # require grad. transformers 5 renamed the switch.
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=_NON_REENTRANT)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=_NON_REENTRANT)


class CausalLMModule(ScheduledOptimization, OOMResilientModule):
    """Fine-tunes a Hugging Face causal LM on ``input_ids``/``attention_mask``/``labels`` batches
    (labels -100 where the loss ignores a token: the prompt and the padding) with the model's own
    next-token loss, a mean over the response tokens; logs ``train/loss`` and ``val/loss``.

    ``finetune`` is ``full``, ``lora`` or ``qlora`` (`finetune.apply_finetune`, with ``lora`` and
    ``qlora``: the fields of `finetune.LoraSettings` and `finetune.QLoraSettings`); the model
    comes from ``config`` and ``config_overrides`` (random weights) or ``pretrained_dir``
    (`lm_builder.build_causal_lm`). The optimizer is given the trainable parameters only.
    """

    @classmethod
    def logged_metrics(cls, model_cfg: Any = None) -> frozenset[str]:
        """Every metric name a run of this module logs (monitors are checked against it)."""
        return frozenset({"train/loss", "val/loss"})

    def __init__(
        self,
        *,
        optimizer: OptimizerFactory,
        config: str | None = None,
        config_overrides: Mapping[str, Any] | None = None,
        pretrained_dir: str | None = None,
        attn_implementation: str | None = None,
        finetune: str = "lora",
        lora: Mapping[str, Any] | None = None,
        qlora: Mapping[str, Any] | None = None,
        lr_schedule: dict[str, Any] | None = None,
        gradient_checkpointing: bool = False,
        compile: bool = False,
    ) -> None:
        super().__init__()
        self.save_hyperparameters(ignore=["optimizer"])
        # Every key is checked before the model is built (seconds for a large one).
        method = check_method(finetune)
        lora_config, qlora_config = lora_settings(lora), qlora_settings(qlora)
        model = build_causal_lm(
            config=config,
            config_overrides=config_overrides,
            pretrained_dir=pretrained_dir,
            attn_implementation=attn_implementation,
        )
        if gradient_checkpointing:
            _enable_checkpointing(model)
        self.model = apply_finetune(model, method, lora_config, qlora_config)
        self.quantized = method == "qlora"
        self.init_optimization(optimizer, lr_schedule, compile=compile, network="model")

    def setup(self, stage: str) -> None:
        datamodule = getattr(self.trainer, "datamodule", None)
        vocab_size = getattr(datamodule, "vocab_size", None)
        embedding_rows = self.model.get_input_embeddings().num_embeddings
        if vocab_size is not None and vocab_size > embedding_rows:
            raise ValueError(
                f"the tokenizer produces {vocab_size} token ids but the model's embedding has "
                f"{embedding_rows} rows (model.config_overrides.vocab_size)"
            )

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """A QLoRA checkpoint's 4-bit layers come back with their quantization state."""
        if self.quantized:
            restore_4bit_weights(self, checkpoint["state_dict"])

    def configure_optimizers(self) -> dict[str, Any]:
        """The optimizer over the trainable parameters (the adapters under LoRA) and its
        per-step schedule over the whole fit."""
        trainable = [p for p in self.parameters() if p.requires_grad]
        optimizer = self.optimizer_factory(params=trainable)
        return self.lr_schedule.lightning_config(
            optimizer, int(self.trainer.estimated_stepping_batches)
        )

    def forward(self, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """The mean next-token loss over the tokens whose label is not -100."""
        return self.model(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            labels=batch["labels"],
        ).loss

    def micro_batch_weight(self, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """The tokens the loss averages over: labels after the first position that are not -100
        (the model predicts token t+1 from tokens up to t)."""
        return (batch["labels"][:, 1:] != IGNORE_INDEX).sum()

    def training_step(self, batch: Mapping[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss = self(batch)
        size = batch["input_ids"].shape[0]
        self.log("train/loss", loss.detach(), prog_bar=True, batch_size=size)
        return loss

    def validation_step(self, batch: Mapping[str, torch.Tensor], batch_idx: int) -> None:
        size = batch["input_ids"].shape[0]
        self.log("val/loss", self(batch), prog_bar=True, batch_size=size)
