"""The shipped architectures have the parameter counts their publishers state."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("transformers", reason="the shipped configs need `transformers`")

import transformers

from vramkit.core.hf_model_configs import NAMED_CONFIGS, build_config, resolve_name

# Parameters (millions) of the published checkpoints, as their model cards or the safetensors
# index of the Hub state them (tied embeddings counted once).
PUBLISHED_MILLIONS = {
    "gpt2": 124,
    "gpt2-xl": 1558,
    "meta-llama/Llama-2-7b-hf": 6738,
    "meta-llama/Llama-2-13b-hf": 13016,
    "meta-llama/Meta-Llama-3-8B": 8030,
    "meta-llama/Llama-3.1-8B": 8030,
    "meta-llama/Llama-3.2-1B": 1236,
    "meta-llama/Llama-3.2-3B": 3213,
    "mistralai/Mistral-7B-v0.1": 7242,
    "mistralai/Mistral-7B-v0.3": 7248,
    "Qwen/Qwen2.5-0.5B": 494,
    "Qwen/Qwen2.5-1.5B": 1544,
    "Qwen/Qwen2.5-3B": 3086,
    "Qwen/Qwen2.5-7B": 7616,
    "google/gemma-2-2b": 2614,
    "google/gemma-2-9b": 9242,
    "microsoft/phi-1_5": 1418,
    "microsoft/phi-2": 2780,
    "microsoft/Phi-3-mini-4k-instruct": 3821,
    "TinyLlama/TinyLlama-1.1B": 1100,
    "EleutherAI/pythia-160m": 162,
    "EleutherAI/pythia-410m": 405,
    "EleutherAI/pythia-1b": 1012,
    "EleutherAI/pythia-1.4b": 1415,
    "EleutherAI/pythia-2.8b": 2775,
    "EleutherAI/pythia-6.9b": 6857,
}


@pytest.mark.parametrize("name", sorted(PUBLISHED_MILLIONS))
def test_a_shipped_causal_lm_has_its_published_parameter_count(name):
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(build_config(name))
    millions = sum(p.numel() for p in model.parameters()) / 1e6
    assert millions == pytest.approx(PUBLISHED_MILLIONS[name], abs=1)


def test_short_and_instruction_tuned_names_resolve_to_their_base_architecture():
    assert resolve_name("Llama-3.1-8B") == resolve_name("meta-llama/Llama-3.1-8B")
    assert resolve_name("Qwen/Qwen2.5-7B-Instruct") == resolve_name("Qwen/Qwen2.5-7B")
    assert resolve_name("meta-llama/Llama-3.1-8B")[0] == "llama"


def test_a_config_json_path_is_read_without_its_file_keys(tmp_path):
    model_type, fields = NAMED_CONFIGS["Qwen/Qwen2.5-0.5B"]
    path = tmp_path / "config.json"
    published = {"architectures": ["Qwen2ForCausalLM"], "model_type": model_type, **fields}
    path.write_text(json.dumps(published))
    assert resolve_name(str(path)) == (model_type, fields)
    assert resolve_name(str(tmp_path)) == (model_type, fields)  # the folder holding it


def test_an_unknown_name_lists_the_closest():
    with pytest.raises(ValueError, match=r"close: .*meta-llama/Llama-3\.1-8B"):
        resolve_name("meta-llama/Llama-3.1-8b")
