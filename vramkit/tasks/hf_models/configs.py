"""The Hugging Face config catalog of the ``hf_models`` task: :mod:`vramkit.core.hf_model_configs`
(in core so that the ``causal_lm`` task, which may not import this one, shares it)."""

from vramkit.core.hf_model_configs import (
    NAMED_CONFIGS,
    build_config,
    listed_names,
    resolve_name,
    transformers_module,
)

__all__ = ["NAMED_CONFIGS", "build_config", "listed_names", "resolve_name", "transformers_module"]
