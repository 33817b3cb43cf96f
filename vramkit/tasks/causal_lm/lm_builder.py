"""A Hugging Face ``AutoModelForCausalLM`` from a config name, a config.json or a folder."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from torch import nn

from vramkit.core.hf_model_configs import build_config, transformers_module


def build_causal_lm(
    *,
    config: str | None,
    config_overrides: Mapping[str, Any] | None = None,
    pretrained_dir: str | Path | None = None,
    attn_implementation: str | None = None,
) -> nn.Module:
    """The causal LM named by ``config`` (a listed checkpoint, a ``config.json`` path or a
    model type; see :mod:`vramkit.core.hf_model_configs`) with ``config_overrides`` applied and
    random weights, or the one saved in ``pretrained_dir`` (``save_pretrained``; read locally,
    nothing downloaded). Exactly one of ``config`` and ``pretrained_dir`` is given. The KV cache
    is off: training never reuses it."""
    if (config is None) == (pretrained_dir is None):
        raise ValueError("give exactly one of model.config and model.pretrained_dir")
    transformers = transformers_module()
    kwargs = {} if attn_implementation is None else {"attn_implementation": attn_implementation}
    if pretrained_dir is not None:
        folder = Path(pretrained_dir)
        if not (folder / "config.json").is_file():
            raise FileNotFoundError(f"model.pretrained_dir has no config.json: {folder}")
        return transformers.AutoModelForCausalLM.from_pretrained(
            str(folder), use_cache=False, local_files_only=True, **kwargs
        )
    hf_config = build_config(config, config_overrides, use_cache=False)
    return transformers.AutoModelForCausalLM.from_config(hf_config, **kwargs)
