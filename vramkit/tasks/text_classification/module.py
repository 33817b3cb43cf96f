"""Sequence classification with a Hugging Face model as a LightningModule (Phi-1.5 and others)."""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from typing import Any

import torch
from torch.nn import functional as F

from vramkit.core.compat import lightning_private
from vramkit.core.config.source import source_of
from vramkit.core.oom.resilient_module import OOMResilientModule
from vramkit.core.optim.scheduled_module import OptimizerFactory, ScheduledOptimization
from vramkit.tasks.text_classification.calibration import (
    MulticlassBrierScore,
    expected_calibration_error,
)
from vramkit.tasks.text_classification.coherence_loss import (
    TERMS,
    CoherenceLoss,
    CoherenceSettings,
)
from vramkit.tasks.text_classification.hf_classifier import build_sequence_classifier
from vramkit.tasks.text_classification.lora_adapters import add_lora, lora_settings
from vramkit.tasks.text_classification.noisy_forward import NoisyForward
from vramkit.tasks.text_classification.pooled_features import logits_and_pooled_features


class TextClassificationModule(ScheduledOptimization, OOMResilientModule):
    """Trains an ``AutoModelForSequenceClassification`` with cross-entropy and reports
    ``train/loss``, ``train/accuracy``, ``val/loss``, ``val/accuracy`` and the calibration of the
    whole validation epoch: ``val/ece`` (15 equal-width bins) and ``val/brier``.

    ``coherence`` (``model.coherence``: fields of
    :class:`~vramkit.tasks.text_classification.coherence_loss.CoherenceSettings`, null for
    cross-entropy alone) adds the auxiliary coherence loss; ``train/loss`` is then the total and
    ``train/loss_ce`` and ``train/loss_<term>`` (unweighted) are logged beside it.

    The model comes from ``hf_config`` (architecture fields, random weights) or
    ``pretrained_dir`` (a local ``save_pretrained`` folder); with ``lora`` (``model.lora``) only
    LoRA adapters and the head train (`lora_adapters.add_lora`); see
    :func:`~vramkit.tasks.text_classification.hf_classifier.build_sequence_classifier`. Batches are
    the text-classification datamodule's ``input_ids``, ``attention_mask`` and ``labels``.
    """

    @classmethod
    def logged_metrics(cls, model_cfg: Any = None) -> frozenset[str]:
        """Every metric name a run of this module logs (monitors are checked against it): the
        loss terms only with ``model.coherence``, calibration at every validation."""
        names = [f"{phase}/{name}" for phase in ("train", "val") for name in ("loss", "accuracy")]
        names += ["val/ece", "val/brier"]
        if model_cfg is not None and model_cfg.get("coherence") is not None:
            names += [f"train/loss_{name}" for name in ("ce", *TERMS)]
        return frozenset(names)

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
        coherence: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__()
        self.save_hyperparameters(ignore=["optimizer"])
        self.model = build_sequence_classifier(
            num_labels=num_labels,
            pad_token_id=pad_token_id,
            hf_config=hf_config,
            pretrained_dir=pretrained_dir,
        )
        self.coherence: CoherenceLoss | None = None
        self.noisy_forward: NoisyForward | None = None
        if coherence is not None:
            settings = CoherenceSettings.from_config(
                coherence,
                key_prefix="model.coherence.",
                source=source_of("model"),
            )
            self.coherence = CoherenceLoss(
                settings, num_classes=num_labels, feature_dim=self.model.config.hidden_size
            )
            if settings.stability > 0:
                self.noisy_forward = NoisyForward(
                    self.model.get_input_embeddings(), settings.noise_std
                )
        self.val_ece = expected_calibration_error(num_labels)
        self.val_brier = MulticlassBrierScore()
        if gradient_checkpointing:
            # Non-reentrant: works with frozen inputs and does not need use_cache games.
            # transformers 5 renamed the switch and warns on the old name (modeling_utils.py,
            # PreTrainedModel.gradient_checkpointing_enable: "deprecated ... removed in v6").
            if hasattr(self.model, "activation_checkpointing_enable"):
                self.model.activation_checkpointing_enable(
                    activation_checkpointing_kwargs={"use_reentrant": False}
                )
            else:
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
        return loss, accuracy, logits

    def _coherent_training_loss(
        self, batch: dict[str, torch.Tensor], coherence: CoherenceLoss, batch_idx: int = 0
    ) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        input_ids, mask, labels = batch["input_ids"], batch["attention_mask"], batch["labels"]
        noisy = self.noisy_forward
        if noisy is not None:  # before the clean forward, whose dropout masks it replays
            noisy.prepare(input_ids.device, (self.global_step, batch_idx))
        logits, features = logits_and_pooled_features(self.model, input_ids, mask)
        noisy_logits = None if noisy is None else partial(noisy.run, partial(self, input_ids, mask))
        terms = coherence(logits, features, labels, noisy_logits=noisy_logits)
        ce = F.cross_entropy(logits.float(), labels)
        accuracy = (logits.argmax(dim=-1) == labels).float().mean()
        return ce + terms.pop("total"), accuracy, {"ce": ce, **terms}

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        size = batch["labels"].shape[0]
        if self.coherence is None:
            loss, accuracy, _ = self._loss_and_accuracy(batch)
        else:
            loss, accuracy, terms = self._coherent_training_loss(batch, self.coherence, batch_idx)
            for name, value in terms.items():
                self.log(f"train/loss_{name}", value.detach(), batch_size=size)
        self.log("train/loss", loss.detach(), prog_bar=True, batch_size=size)
        self.log("train/accuracy", accuracy, batch_size=size)
        return loss

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        loss, accuracy, logits = self._loss_and_accuracy(batch)
        size = batch["labels"].shape[0]
        self.log("val/loss", loss, batch_size=size)
        self.log("val/accuracy", accuracy, prog_bar=True, batch_size=size)
        if lightning_private.attached_trainer(self) is None:
            return  # the memory planner's trace: its fake tensors cannot meet the metrics' states
        # After the device work: a micro-batch redone after an OOM is counted once.
        probabilities = torch.softmax(logits.detach().float(), dim=-1)
        self.val_ece.update(probabilities, batch["labels"])
        self.val_brier.update(probabilities, batch["labels"])

    def on_validation_epoch_end(self) -> None:
        # Over the whole epoch, not a mean of per-batch values (ECE is not additive).
        self.log("val/ece", self.val_ece.compute())
        self.log("val/brier", self.val_brier.compute())
        self.val_ece.reset()
        self.val_brier.reset()
