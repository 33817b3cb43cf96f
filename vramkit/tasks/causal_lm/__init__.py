"""Causal-LM fine-tuning (``task=causal_lm``): full, LoRA or QLoRA on prompt/response pairs."""
