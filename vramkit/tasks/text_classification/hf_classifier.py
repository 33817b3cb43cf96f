"""A Hugging Face ``AutoModelForSequenceClassification`` from a config dict or a local folder."""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from torch import nn

from vramkit.core.optional_dependency import import_optional

# Accepted by every config class, by name or through legacy conversion (RoPE settings).
_COMMON_KEYS = {"attn_implementation", "rope_theta", "partial_rotary_factor", "rope_scaling"}
# Set by the builder from the task's data; a value in hf_config would be silently replaced.
_FROM_DATA = ("num_labels", "pad_token_id")


def _transformers() -> Any:
    return import_optional("transformers", extra="nlp", purpose="task=text_classification")


def build_sequence_classifier(
    *,
    num_labels: int,
    pad_token_id: int,
    hf_config: Mapping[str, Any] | None = None,
    pretrained_dir: str | Path | None = None,
) -> nn.Module:
    """A sequence classifier with ``num_labels`` outputs that pools at the last non-padding token.

    ``hf_config`` holds ``model_type`` (``phi``, ``llama``, …) and the architecture's fields:
    the weights are initialised at random, nothing is read or downloaded. ``pretrained_dir`` is
    a local folder written by ``save_pretrained`` (its classification head is re-initialised
    when its label count differs). Exactly one of the two is given. The model's KV cache is
    off: training never reuses it.
    """
    if (hf_config is None) == (pretrained_dir is None):
        raise ValueError("give exactly one of model.hf_config and model.pretrained_dir")
    for key in _FROM_DATA:
        if hf_config is not None and key in hf_config:
            raise ValueError(f"model.hf_config.{key} comes from the data config; remove it")
    transformers = _transformers()
    if pretrained_dir is not None:
        folder = Path(pretrained_dir)
        if not (folder / "config.json").is_file():
            raise FileNotFoundError(f"model.pretrained_dir has no config.json: {folder}")
        return transformers.AutoModelForSequenceClassification.from_pretrained(
            str(folder),
            num_labels=num_labels,
            pad_token_id=pad_token_id,
            use_cache=False,
            local_files_only=True,
            ignore_mismatched_sizes=True,
        )
    config = sequence_classifier_config(hf_config, num_labels=num_labels, pad_token_id=pad_token_id)
    return transformers.AutoModelForSequenceClassification.from_config(config)


def sequence_classifier_config(
    hf_config: Mapping[str, Any], *, num_labels: int, pad_token_id: int
) -> Any:
    """The ``PretrainedConfig`` for ``hf_config``; an unknown field is an error naming it."""
    transformers = _transformers()
    fields = dict(hf_config)
    model_type = fields.pop("model_type", None)
    mapping = transformers.models.auto.configuration_auto.CONFIG_MAPPING
    if model_type not in mapping:
        close = difflib.get_close_matches(str(model_type), list(mapping.keys()), n=3)
        raise ValueError(
            f"model.hf_config.model_type {model_type!r} is not a transformers model type"
            + (f" (close: {', '.join(close)})" if close else "")
        )
    config_class = mapping[model_type]
    known = _known_fields(transformers, config_class)
    for key in fields:
        if key not in known:
            close = difflib.get_close_matches(key, sorted(known), n=3)
            raise ValueError(
                f"model.hf_config.{key} is not a field of {config_class.__name__}"
                + (f" (did you mean {', '.join(close)}?)" if close else "")
            )
    return transformers.AutoConfig.for_model(
        model_type, **fields, num_labels=num_labels, pad_token_id=pad_token_id, use_cache=False
    )


def _known_fields(transformers: Any, config_class: type) -> set[str]:
    base = transformers.PretrainedConfig
    known = set(_COMMON_KEYS)
    for cls in (config_class, base):
        known |= set(inspect.signature(cls.__init__).parameters) - {"self", "kwargs"}
    known |= set(base().to_dict())
    known |= set(getattr(config_class, "attribute_map", {}))
    return known
