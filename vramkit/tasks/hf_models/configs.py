"""Transformers configs from a name and settings, without the Hub.

A *config name* is either a checkpoint whose published ``config.json`` architecture is listed in
:data:`NAMED_CONFIGS` (``gpt2``, ``bert-base-uncased``, ``opt-350m``, …) or any transformers
``model_type`` (``llama``, ``gpt_neox``, ``vit``, …), which takes its config class's defaults.
``overrides`` are further ``config.json`` fields (``hidden_size``, ``num_hidden_layers``, …);
an unknown field is an error naming it. Nothing is read from disk or downloaded.
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Mapping
from typing import Any

from vramkit.core.optional_dependency import import_optional

# Published architectures (the checkpoints' config.json), as (model_type, fields that differ from
# the config class's defaults). Random weights: only the shapes matter to memory.
NAMED_CONFIGS: dict[str, tuple[str, dict[str, Any]]] = {
    "gpt2": ("gpt2", {}),  # GPT2Config() is gpt2 (124 M)
    "gpt2-medium": ("gpt2", {"n_embd": 1024, "n_layer": 24, "n_head": 16}),
    "gpt2-large": ("gpt2", {"n_embd": 1280, "n_layer": 36, "n_head": 20}),
    "bert-base-uncased": ("bert", {}),  # BertConfig() is bert-base-uncased
    "bert-large-uncased": (
        "bert",
        {
            "hidden_size": 1024,
            "num_hidden_layers": 24,
            "num_attention_heads": 16,
            "intermediate_size": 4096,
        },
    ),
    "opt-125m": ("opt", {}),  # OPTConfig() is opt-125m
    "opt-350m": (
        "opt",
        {
            "hidden_size": 1024,
            "num_hidden_layers": 24,
            "num_attention_heads": 16,
            "ffn_dim": 4096,
            "word_embed_proj_dim": 512,
            "do_layer_norm_before": False,
        },
    ),
    "vit-base-patch16-224": ("vit", {}),  # ViTConfig() is ViT-B/16 at 224 px
}
# Checkpoint names as the Hub spells them with their organisation.
_ALIASES = {
    "openai-community/gpt2": "gpt2",
    "openai-community/gpt2-medium": "gpt2-medium",
    "openai-community/gpt2-large": "gpt2-large",
    "google-bert/bert-base-uncased": "bert-base-uncased",
    "google-bert/bert-large-uncased": "bert-large-uncased",
    "facebook/opt-125m": "opt-125m",
    "facebook/opt-350m": "opt-350m",
    "google/vit-base-patch16-224": "vit-base-patch16-224",
}
# Accepted by every config class, by name or through legacy conversion.
_COMMON_KEYS = {"attn_implementation", "rope_theta", "partial_rotary_factor", "rope_scaling"}


def transformers_module() -> Any:
    """The ``transformers`` package (an optional dependency: ``pip install 'vramkit[nlp]'``)."""
    return import_optional("transformers", extra="nlp", purpose="the hf_models task")


def resolve_name(config: str) -> tuple[str, dict[str, Any]]:
    """``(model_type, fields)`` of a config name: a listed checkpoint or a model type."""
    name = _ALIASES.get(config, config)
    if name in NAMED_CONFIGS:
        model_type, fields = NAMED_CONFIGS[name]
        return model_type, dict(fields)
    mapping = transformers_module().models.auto.configuration_auto.CONFIG_MAPPING
    if name in mapping:
        return name, {}
    # A listed checkpoint named as its model type (gpt2) is one choice, not two.
    choices = list(dict.fromkeys([*sorted(NAMED_CONFIGS), *sorted(mapping.keys())]))
    close = difflib.get_close_matches(name, choices, n=3)
    listed = ", ".join(sorted(NAMED_CONFIGS))
    raise ValueError(
        f"model.config {config!r} is neither a listed checkpoint ({listed})"
        " nor a transformers model type"
        + (f" (close: {', '.join(close)})" if close else "")
        + "; give a model type and its config.json fields in model.config_overrides"
    )


def _known_fields(config_class: type) -> set[str]:
    base = transformers_module().PretrainedConfig
    known = set(_COMMON_KEYS)
    for cls in (config_class, base):
        known |= set(inspect.signature(cls.__init__).parameters) - {"self", "kwargs"}
    known |= set(base().to_dict())
    known |= set(getattr(config_class, "attribute_map", {}))
    # transformers 5 declares many config fields as class annotations only.
    for cls in config_class.__mro__:
        known |= set(getattr(cls, "__annotations__", {}))
    return known


def build_config(config: str, overrides: Mapping[str, Any] | None = None, **fixed: Any) -> Any:
    """The ``PretrainedConfig`` named by ``config`` with ``overrides`` and ``fixed`` applied.

    ``fixed`` are set by the task (``num_labels``, ``use_cache``) and win over the name's fields.
    """
    model_type, fields = resolve_name(config)
    overrides = dict(overrides or {})
    transformers = transformers_module()
    config_class = transformers.models.auto.configuration_auto.CONFIG_MAPPING[model_type]
    known = _known_fields(config_class)
    for key in overrides:
        if key not in known:
            close = difflib.get_close_matches(key, sorted(known), n=3)
            raise ValueError(
                f"model.config_overrides.{key} is not a field of {config_class.__name__}"
                + (f" (did you mean {', '.join(close)}?)" if close else "")
            )
    fields.update(overrides)
    fields.update(fixed)
    return transformers.AutoConfig.for_model(model_type, **fields)
