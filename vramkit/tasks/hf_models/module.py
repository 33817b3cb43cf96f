"""A Hugging Face model built from its config as a LightningModule: plan it, or train it.

One module serves four tasks, each an ``AutoModelFor…`` class: ``causal_lm`` (next-token loss on
``input_ids``), ``masked_lm`` (``labels`` with -100 where nothing is masked), ``seq_cls``
(one label per text) and ``image_cls`` (``pixel_values`` and one label per image). The weights
are random (see :mod:`vramkit.tasks.hf_models.configs`); batches come from
:mod:`vramkit.tasks.hf_models.data` or any datamodule giving the same keys.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from vramkit.core.oom.resilient_module import OOMResilientModule
from vramkit.core.optim.scheduled_module import OptimizerFactory, ScheduledOptimization
from vramkit.tasks.hf_models.configs import build_config, transformers_module

AUTO_CLASSES = {
    "causal_lm": "AutoModelForCausalLM",
    "masked_lm": "AutoModelForMaskedLM",
    "seq_cls": "AutoModelForSequenceClassification",
    "image_cls": "AutoModelForImageClassification",
}
CLASSIFICATION = ("seq_cls", "image_cls")
_NON_REENTRANT = {"use_reentrant": False}
LOSSES = ("model", "logits_sum")
"""``model``: the model's own loss from ``labels`` (what ``Trainer`` trains); ``logits_sum``:
``logits.sum()``, what several published memory benchmarks back-propagate instead."""


def build_model(
    task: str,
    config: str,
    config_overrides: Mapping[str, Any] | None = None,
    *,
    num_labels: int | None = None,
    attn_implementation: str | None = None,
) -> nn.Module:
    """The ``AutoModelFor…`` of ``task`` from the named config, with random weights."""
    if task not in AUTO_CLASSES:
        raise ValueError(f"model.task must be one of {sorted(AUTO_CLASSES)}, got {task!r}")
    fixed: dict[str, Any] = {}
    if task in CLASSIFICATION:
        if num_labels is None:
            raise ValueError(f"model.num_labels is needed for task {task}")
        fixed["num_labels"] = num_labels
    elif num_labels is not None:
        raise ValueError(f"model.num_labels does not apply to task {task}; set it to null")
    if task == "causal_lm":
        fixed["use_cache"] = False  # training never reuses the KV cache
    hf_config = build_config(config, config_overrides, **fixed)
    if task == "seq_cls" and getattr(hf_config, "pad_token_id", None) is None:
        # Decoder classifiers pool the last token that is not padding and need a padding id;
        # the random data never draws id 0.
        hf_config.pad_token_id = 0
    auto_class = getattr(transformers_module(), AUTO_CLASSES[task])
    kwargs = {} if attn_implementation is None else {"attn_implementation": attn_implementation}
    return auto_class.from_config(hf_config, **kwargs)


def _enable_checkpointing(model: nn.Module) -> None:
    # Non-reentrant: works with frozen inputs. transformers 5 renamed the switch.
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=_NON_REENTRANT)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=_NON_REENTRANT)


class HFModelModule(ScheduledOptimization, OOMResilientModule):
    """Trains a Hugging Face ``AutoModelFor<task>`` built from ``config`` (a checkpoint name or a
    model type) and ``config_overrides`` (``config.json`` fields); logs ``train/loss``,
    ``val/loss`` and, for classification, ``train/accuracy`` and ``val/accuracy``."""

    @classmethod
    def logged_metrics(cls, model_cfg: Any = None) -> frozenset[str]:
        """Every metric name a run of this module logs (monitors are checked against it)."""
        classifies = model_cfg is None or model_cfg.get("task") in CLASSIFICATION
        names = ("loss", "accuracy") if classifies else ("loss",)
        return frozenset(f"{phase}/{name}" for phase in ("train", "val") for name in names)

    def __init__(
        self,
        *,
        task: str,
        config: str,
        optimizer: OptimizerFactory,
        config_overrides: Mapping[str, Any] | None = None,
        num_labels: int | None = None,
        attn_implementation: str | None = None,
        loss: str = "model",
        lr_schedule: dict[str, Any] | None = None,
        gradient_checkpointing: bool = False,
        compile: bool = False,
    ) -> None:
        super().__init__()
        if loss not in LOSSES:
            raise ValueError(f"model.loss must be one of {LOSSES}, got {loss!r}")
        self.save_hyperparameters(ignore=["optimizer"])
        self.task = task
        self.loss_kind = loss
        self.model = build_model(
            task,
            config,
            config_overrides,
            num_labels=num_labels,
            attn_implementation=attn_implementation,
        )
        if gradient_checkpointing:
            _enable_checkpointing(self.model)
        self.init_optimization(optimizer, lr_schedule, compile=compile, network="model")

    def _inputs(self, batch: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        keys = ("pixel_values",) if self.task == "image_cls" else ("input_ids", "attention_mask")
        inputs = {key: batch[key] for key in keys if key in batch}
        if self.loss_kind == "model":
            inputs["labels"] = batch["labels"]
        return inputs

    def forward(self, batch: Mapping[str, torch.Tensor]) -> Any:
        """The model's output (``logits``, and ``loss`` with ``model.loss=model``) for a batch."""
        return self.model(**self._inputs(batch))

    def _step(self, batch: Mapping[str, torch.Tensor], phase: str) -> torch.Tensor:
        output = self(batch)
        loss = output.loss if self.loss_kind == "model" else output.logits.sum()
        size = next(iter(batch.values())).shape[0]
        self.log(f"{phase}/loss", loss.detach(), prog_bar=phase == "train", batch_size=size)
        if self.task in CLASSIFICATION:
            accuracy = (output.logits.argmax(dim=-1) == batch["labels"]).float().mean()
            self.log(f"{phase}/accuracy", accuracy, batch_size=size)
        return loss

    def training_step(self, batch: Mapping[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        return self._step(batch, "train")

    def validation_step(self, batch: Mapping[str, torch.Tensor], batch_idx: int) -> None:
        self._step(batch, "val")
