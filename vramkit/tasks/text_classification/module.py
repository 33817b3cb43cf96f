"""Sequence classification with a Hugging Face model as a LightningModule (Phi-1.5 and others)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch.nn import functional as F

from vramkit.core.oom.resilient_module import OOMResilientModule
from vramkit.core.optim.scheduled_module import OptimizerFactory, ScheduledOptimization
from vramkit.tasks.text_classification.hf_classifier import build_sequence_classifier
from vramkit.tasks.text_classification.lora_adapters import add_lora, lora_settings


class TextClassificationModule(ScheduledOptimization, OOMResilientModule):
    """Trains an ``AutoModelForSequenceClassification`` with cross-entropy and reports
    ``train/loss``, ``train/accuracy``, ``val/loss`` and ``val/accuracy``.

    The model comes from ``hf_config`` (architecture fields, random weights) or
    ``pretrained_dir`` (a local ``save_pretrained`` folder); with ``lora`` (``model.lora``) only
    LoRA adapters and the head train (`lora_adapters.add_lora`); see
    :func:`~vramkit.tasks.text_classification.hf_classifier.build_sequence_classifier`. Batches are
    the text-classification datamodule's ``input_ids``, ``attention_mask`` and ``labels``.
    """

    @classmethod
    def logged_metrics(cls, model_cfg: Any = None) -> frozenset[str]:
        """Every metric name a run of this module logs (monitors are checked against it)."""
        return frozenset(
            f"{phase}/{name}" for phase in ("train", "val") for name in ("loss", "accuracy")
        )

    def __init__(
        self,
        *,
        num_labels: int,
        pad_token_id: int,
        optimizer: OptimizerFactory,
        hf_config: Mapping[str, Any] | None = None,
        pretrained_dir: str | None = None,
        lr_schedule: dict[str, Any] | None = None,
        gradient_checkpointing: bool = False,
        lora: Mapping[str, Any] | None = None,
        compile: bool = False,
    ) -> None:
        super().__init__()
        self.save_hyperparameters(ignore=["optimizer"])
        self.model = build_sequence_classifier(
            num_labels=num_labels,
            pad_token_id=pad_token_id,
            hf_config=hf_config,
            pretrained_dir=pretrained_dir,
        )
        if gradient_checkpointing:
            # Non-reentrant: works with frozen inputs and does not need use_cache games.
            self.model.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False}
            )
        lora_config = lora_settings(lora)
        if lora_config is not None:
            self.model = add_lora(self.model, lora_config)
        self.init_optimization(optimizer, lr_schedule, compile=compile, network="model")

    def setup(self, stage: str) -> None:
        datamodule = getattr(self.trainer, "datamodule", None)
        vocab_size = getattr(datamodule, "vocab_size", None)
        if vocab_size is not None and vocab_size > self.model.config.vocab_size:
            raise ValueError(
                f"the tokenizer produces {vocab_size} token ids but the model's embedding has "
                f"{self.model.config.vocab_size} (model.hf_config.vocab_size)"
            )

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Class logits (B, num_labels) for token ids and their mask (B, tokens)."""
        return self.model(input_ids=input_ids, attention_mask=attention_mask).logits

    def _loss_and_accuracy(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, ...]:
        logits = self(batch["input_ids"], batch["attention_mask"])
        loss = F.cross_entropy(logits.float(), batch["labels"])
        accuracy = (logits.argmax(dim=-1) == batch["labels"]).float().mean()
        return loss, accuracy

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss, accuracy = self._loss_and_accuracy(batch)
        size = batch["labels"].shape[0]
        self.log("train/loss", loss.detach(), prog_bar=True, batch_size=size)
        self.log("train/accuracy", accuracy, batch_size=size)
        return loss

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        loss, accuracy = self._loss_and_accuracy(batch)
        size = batch["labels"].shape[0]
        self.log("val/loss", loss, batch_size=size)
        self.log("val/accuracy", accuracy, prog_bar=True, batch_size=size)
