"""Transformers configs from a name or a ``config.json``, without the Hub.

A *config name* is a checkpoint whose published ``config.json`` architecture is listed in
:data:`NAMED_CONFIGS` (``gpt2``, ``meta-llama/Llama-3.1-8B``, ``Qwen/Qwen2.5-0.5B``, …), any
transformers ``model_type`` (``llama``, ``gpt_neox``, ``vit``, …), which takes its config
class's defaults, or the path of a ``config.json`` file (or of a folder holding one).
``overrides`` are further ``config.json`` fields (``hidden_size``, ``num_hidden_layers``, …);
an unknown field is an error naming it. Nothing is downloaded.

Shared by the tasks that build Hugging Face models (``hf_models``, ``causal_lm``), which may not
import each other; it imports no task.
"""

from __future__ import annotations

import difflib
import inspect
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from vramkit.core.optional_dependency import import_optional

_LLAMA3_ROPE = {  # Llama 3.1 / 3.2's "llama3" RoPE scaling (their config.json, rope_scaling)
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}
_LLAMA3 = {  # Meta-Llama-3-8B's config.json fields that differ from LlamaConfig()
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-05,
    "rope_theta": 500000.0,
    "bos_token_id": 128000,
    "eos_token_id": 128001,
}
_QWEN25 = {  # fields every Qwen2.5 base checkpoint shares (Qwen/Qwen2.5-*/config.json)
    "vocab_size": 151936,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "hidden_act": "silu",
    "bos_token_id": 151643,
    "eos_token_id": 151643,
    "use_sliding_window": False,
}
_GEMMA2 = {  # fields every Gemma 2 base checkpoint shares (google/gemma-2-*/config.json)
    "vocab_size": 256000,
    "head_dim": 256,
    "max_position_embeddings": 8192,
    "sliding_window": 4096,
    "attn_logit_softcapping": 50.0,
    "final_logit_softcapping": 30.0,
    "query_pre_attn_scalar": 256,
    "hidden_activation": "gelu_pytorch_tanh",
    "rms_norm_eps": 1e-06,
    "bos_token_id": 2,
    "eos_token_id": 1,
    "pad_token_id": 0,
}
_PYTHIA = {  # fields every Pythia checkpoint shares (EleutherAI/pythia-*/config.json)
    "vocab_size": 50304,
    "max_position_embeddings": 2048,
    "rotary_pct": 0.25,
    "rotary_emb_base": 10000,
    "use_parallel_residual": True,
    "tie_word_embeddings": False,
    "bos_token_id": 0,
    "eos_token_id": 0,
}


def _pythia(hidden: int, layers: int, heads: int, **more: Any) -> dict[str, Any]:
    return {
        **_PYTHIA,
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "intermediate_size": 4 * hidden,
        **more,
    }


# Published architectures: the checkpoint's config.json on the Hugging Face Hub
# (https://huggingface.co/<name>/blob/main/config.json), as (model_type, the fields that differ
# from the config class's defaults, or that memory depends on). Random weights: only the shapes
# matter to memory. Gated checkpoints (Llama, Gemma, Mistral) list the same fields in their
# model cards and in the transformers docs of their model type.
NAMED_CONFIGS: dict[str, tuple[str, dict[str, Any]]] = {
    # GPT-2 (openai-community/gpt2*): GPT2Config() is gpt2 (124 M)
    "gpt2": ("gpt2", {}),
    "gpt2-medium": ("gpt2", {"n_embd": 1024, "n_layer": 24, "n_head": 16}),
    "gpt2-large": ("gpt2", {"n_embd": 1280, "n_layer": 36, "n_head": 20}),
    "gpt2-xl": ("gpt2", {"n_embd": 1600, "n_layer": 48, "n_head": 25}),
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
    # Llama 2 (meta-llama/Llama-2-*-hf)
    "meta-llama/Llama-2-7b-hf": (
        "llama",
        {
            "hidden_size": 4096,
            "intermediate_size": 11008,
            "num_hidden_layers": 32,
            "num_attention_heads": 32,
            "num_key_value_heads": 32,
            "vocab_size": 32000,
            "max_position_embeddings": 4096,
            "rms_norm_eps": 1e-05,
            "bos_token_id": 1,
            "eos_token_id": 2,
        },
    ),
    "meta-llama/Llama-2-13b-hf": (
        "llama",
        {
            "hidden_size": 5120,
            "intermediate_size": 13824,
            "num_hidden_layers": 40,
            "num_attention_heads": 40,
            "num_key_value_heads": 40,
            "vocab_size": 32000,
            "max_position_embeddings": 4096,
            "rms_norm_eps": 1e-05,
            "bos_token_id": 1,
            "eos_token_id": 2,
        },
    ),
    # Llama 3 / 3.1 / 3.2 (meta-llama/Meta-Llama-3-8B, Llama-3.1-8B, Llama-3.2-1B, -3B)
    "meta-llama/Meta-Llama-3-8B": ("llama", _LLAMA3),
    "meta-llama/Llama-3.1-8B": (
        "llama",
        {**_LLAMA3, "max_position_embeddings": 131072, "rope_scaling": _LLAMA3_ROPE},
    ),
    "meta-llama/Llama-3.2-1B": (
        "llama",
        {
            **_LLAMA3,
            "hidden_size": 2048,
            "intermediate_size": 8192,
            "num_hidden_layers": 16,
            "num_attention_heads": 32,
            "head_dim": 64,
            "max_position_embeddings": 131072,
            "rope_scaling": {**_LLAMA3_ROPE, "factor": 32.0},
            "tie_word_embeddings": True,
        },
    ),
    "meta-llama/Llama-3.2-3B": (
        "llama",
        {
            **_LLAMA3,
            "hidden_size": 3072,
            "intermediate_size": 8192,
            "num_hidden_layers": 28,
            "num_attention_heads": 24,
            "head_dim": 128,
            "max_position_embeddings": 131072,
            "rope_scaling": {**_LLAMA3_ROPE, "factor": 32.0},
            "tie_word_embeddings": True,
        },
    ),
    # Mistral (mistralai/Mistral-7B-v0.1, -v0.3)
    "mistralai/Mistral-7B-v0.1": (
        "mistral",
        {
            "hidden_size": 4096,
            "intermediate_size": 14336,
            "num_hidden_layers": 32,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "vocab_size": 32000,
            "max_position_embeddings": 32768,
            "sliding_window": 4096,
            "rope_theta": 10000.0,
            "rms_norm_eps": 1e-05,
        },
    ),
    "mistralai/Mistral-7B-v0.3": (
        "mistral",
        {
            "hidden_size": 4096,
            "intermediate_size": 14336,
            "num_hidden_layers": 32,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "vocab_size": 32768,
            "max_position_embeddings": 32768,
            "sliding_window": None,
            "rope_theta": 1000000.0,
            "rms_norm_eps": 1e-05,
        },
    ),
    # Qwen2.5 (Qwen/Qwen2.5-0.5B, -1.5B, -3B, -7B)
    "Qwen/Qwen2.5-0.5B": (
        "qwen2",
        {
            **_QWEN25,
            "hidden_size": 896,
            "intermediate_size": 4864,
            "num_hidden_layers": 24,
            "num_attention_heads": 14,
            "num_key_value_heads": 2,
            "max_position_embeddings": 32768,
            "tie_word_embeddings": True,
        },
    ),
    "Qwen/Qwen2.5-1.5B": (
        "qwen2",
        {
            **_QWEN25,
            "hidden_size": 1536,
            "intermediate_size": 8960,
            "num_hidden_layers": 28,
            "num_attention_heads": 12,
            "num_key_value_heads": 2,
            "max_position_embeddings": 131072,
            "tie_word_embeddings": True,
        },
    ),
    "Qwen/Qwen2.5-3B": (
        "qwen2",
        {
            **_QWEN25,
            "hidden_size": 2048,
            "intermediate_size": 11008,
            "num_hidden_layers": 36,
            "num_attention_heads": 16,
            "num_key_value_heads": 2,
            "max_position_embeddings": 32768,
            "tie_word_embeddings": True,
        },
    ),
    "Qwen/Qwen2.5-7B": (
        "qwen2",
        {
            **_QWEN25,
            "vocab_size": 152064,
            "hidden_size": 3584,
            "intermediate_size": 18944,
            "num_hidden_layers": 28,
            "num_attention_heads": 28,
            "num_key_value_heads": 4,
            "max_position_embeddings": 131072,
            "tie_word_embeddings": False,
        },
    ),
    # Gemma 2 (google/gemma-2-2b, -9b)
    "google/gemma-2-2b": (
        "gemma2",
        {
            **_GEMMA2,
            "hidden_size": 2304,
            "intermediate_size": 9216,
            "num_hidden_layers": 26,
            "num_attention_heads": 8,
            "num_key_value_heads": 4,
        },
    ),
    "google/gemma-2-9b": (
        "gemma2",
        {
            **_GEMMA2,
            "hidden_size": 3584,
            "intermediate_size": 14336,
            "num_hidden_layers": 42,
            "num_attention_heads": 16,
            "num_key_value_heads": 8,
        },
    ),
    # Phi (microsoft/phi-1_5, phi-2, Phi-3-mini-4k-instruct)
    "microsoft/phi-1_5": (
        "phi",
        {
            "vocab_size": 51200,
            "hidden_size": 2048,
            "intermediate_size": 8192,
            "num_hidden_layers": 24,
            "num_attention_heads": 32,
            "max_position_embeddings": 2048,
            "partial_rotary_factor": 0.5,
            "hidden_act": "gelu_new",
            "tie_word_embeddings": False,
            "bos_token_id": 50256,
            "eos_token_id": 50256,
        },
    ),
    "microsoft/phi-2": (
        "phi",
        {
            "vocab_size": 51200,
            "hidden_size": 2560,
            "intermediate_size": 10240,
            "num_hidden_layers": 32,
            "num_attention_heads": 32,
            "max_position_embeddings": 2048,
            "partial_rotary_factor": 0.4,
            "hidden_act": "gelu_new",
            "tie_word_embeddings": False,
            "bos_token_id": 50256,
            "eos_token_id": 50256,
        },
    ),
    "microsoft/Phi-3-mini-4k-instruct": (
        "phi3",
        {
            "vocab_size": 32064,
            "hidden_size": 3072,
            "intermediate_size": 8192,
            "num_hidden_layers": 32,
            "num_attention_heads": 32,
            "num_key_value_heads": 32,
            "max_position_embeddings": 4096,
            "original_max_position_embeddings": 4096,
            "sliding_window": 2047,
            "rms_norm_eps": 1e-05,
            "bos_token_id": 1,
            "eos_token_id": 32000,
            "pad_token_id": 32000,
        },
    ),
    # TinyLlama (TinyLlama/TinyLlama-1.1B-intermediate-step-1431k-3T, and its chat version)
    "TinyLlama/TinyLlama-1.1B": (
        "llama",
        {
            "hidden_size": 2048,
            "intermediate_size": 5632,
            "num_hidden_layers": 22,
            "num_attention_heads": 32,
            "num_key_value_heads": 4,
            "vocab_size": 32000,
            "max_position_embeddings": 2048,
            "rms_norm_eps": 1e-05,
            "bos_token_id": 1,
            "eos_token_id": 2,
        },
    ),
    # Pythia (EleutherAI/pythia-*, the deduplicated runs have the same shapes)
    "EleutherAI/pythia-160m": ("gpt_neox", _pythia(768, 12, 12)),
    "EleutherAI/pythia-410m": ("gpt_neox", _pythia(1024, 24, 16)),
    "EleutherAI/pythia-1b": ("gpt_neox", _pythia(2048, 16, 8)),
    "EleutherAI/pythia-1.4b": ("gpt_neox", _pythia(2048, 24, 16)),
    "EleutherAI/pythia-2.8b": ("gpt_neox", _pythia(2560, 32, 32)),
    "EleutherAI/pythia-6.9b": ("gpt_neox", _pythia(4096, 32, 32, vocab_size=50432)),
}
# Other spellings of the listed checkpoints: the Hub's organisation-qualified and short names.
_ALIASES = {
    "openai-community/gpt2": "gpt2",
    "openai-community/gpt2-medium": "gpt2-medium",
    "openai-community/gpt2-large": "gpt2-large",
    "openai-community/gpt2-xl": "gpt2-xl",
    "google-bert/bert-base-uncased": "bert-base-uncased",
    "google-bert/bert-large-uncased": "bert-large-uncased",
    "facebook/opt-125m": "opt-125m",
    "facebook/opt-350m": "opt-350m",
    "google/vit-base-patch16-224": "vit-base-patch16-224",
    "meta-llama/Meta-Llama-3.1-8B": "meta-llama/Llama-3.1-8B",
    "meta-llama/Llama-3-8B": "meta-llama/Meta-Llama-3-8B",
    "microsoft/Phi-3-mini-4k": "microsoft/Phi-3-mini-4k-instruct",
    "TinyLlama/TinyLlama-1.1B-intermediate-step-1431k-3T": "TinyLlama/TinyLlama-1.1B",
    "TinyLlama/TinyLlama-1.1B-Chat-v1.0": "TinyLlama/TinyLlama-1.1B",
    # Instruction-tuned variants share their base model's architecture.
    "meta-llama/Llama-2-7b-chat-hf": "meta-llama/Llama-2-7b-hf",
    "meta-llama/Llama-2-13b-chat-hf": "meta-llama/Llama-2-13b-hf",
    "meta-llama/Meta-Llama-3-8B-Instruct": "meta-llama/Meta-Llama-3-8B",
    "meta-llama/Llama-3.1-8B-Instruct": "meta-llama/Llama-3.1-8B",
    "meta-llama/Llama-3.2-1B-Instruct": "meta-llama/Llama-3.2-1B",
    "meta-llama/Llama-3.2-3B-Instruct": "meta-llama/Llama-3.2-3B",
    "mistralai/Mistral-7B-Instruct-v0.1": "mistralai/Mistral-7B-v0.1",
    "mistralai/Mistral-7B-Instruct-v0.3": "mistralai/Mistral-7B-v0.3",
    "google/gemma-2-2b-it": "google/gemma-2-2b",
    "google/gemma-2-9b-it": "google/gemma-2-9b",
    **{
        f"Qwen/Qwen2.5-{size}-Instruct": f"Qwen/Qwen2.5-{size}"
        for size in ("0.5B", "1.5B", "3B", "7B")
    },
}
# Bare checkpoint names without their organisation (phi-2, Llama-3.1-8B, pythia-1b, ...).
_ALIASES.update(
    {
        name.split("/", 1)[1]: name
        for name in NAMED_CONFIGS
        if "/" in name and name.split("/", 1)[1] not in NAMED_CONFIGS
    }
)
# Accepted by every config class, by name or through legacy conversion.
_COMMON_KEYS = {"attn_implementation", "rope_theta", "partial_rotary_factor", "rope_scaling"}
# config.json keys that describe the file, not the architecture.
_FILE_KEYS = ("architectures", "transformers_version", "_name_or_path", "torch_dtype", "dtype")


def transformers_module() -> Any:
    """The ``transformers`` package (an optional dependency: ``pip install 'vramkit[nlp]'``)."""
    return import_optional("transformers", extra="nlp", purpose="a Hugging Face model")


def listed_names() -> list[str]:
    """Every config name of :data:`NAMED_CONFIGS` and its aliases, sorted."""
    return sorted({*NAMED_CONFIGS, *_ALIASES})


def _config_file(config: str) -> Path | None:
    path = Path(config).expanduser()
    if path.is_dir() and (path / "config.json").is_file():
        return path / "config.json"
    if path.suffix == ".json":
        if not path.is_file():
            raise ValueError(f"model.config {config!r}: no such config.json file")
        return path
    return None


def _read_config_file(path: Path) -> tuple[str, dict[str, Any]]:
    try:
        fields = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"model.config {path}: not a readable config.json ({error})") from None
    if not isinstance(fields, dict) or "model_type" not in fields:
        raise ValueError(f"model.config {path}: a config.json names its model_type")
    model_type = fields.pop("model_type")
    for key in _FILE_KEYS:
        fields.pop(key, None)
    return model_type, fields


def resolve_name(config: str) -> tuple[str, dict[str, Any]]:
    """``(model_type, fields)`` of a config name: a listed checkpoint, a ``config.json`` path
    or a model type."""
    name = _ALIASES.get(config, config)
    if name in NAMED_CONFIGS:
        model_type, fields = NAMED_CONFIGS[name]
        return model_type, json.loads(json.dumps(fields))  # a deep copy
    path = _config_file(config)
    mapping = transformers_module().models.auto.configuration_auto.CONFIG_MAPPING
    if path is not None:
        model_type, fields = _read_config_file(path)
        if model_type not in mapping:
            raise ValueError(f"model.config {path}: model_type {model_type!r} is unknown")
        return model_type, fields
    if name in mapping:
        return name, {}
    # A listed checkpoint named as its model type (gpt2) is one choice, not two.
    choices = list(dict.fromkeys([*listed_names(), *sorted(mapping.keys())]))
    close = difflib.get_close_matches(name, choices, n=3)
    raise ValueError(
        f"model.config {config!r} is neither a listed checkpoint, a config.json path"
        " nor a transformers model type"
        + (f" (close: {', '.join(close)})" if close else "")
        + "; list: vramkit.core.hf_model_configs.listed_names()"
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
