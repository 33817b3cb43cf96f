"""Which models the planner treats as adapter fine-tunes of a causal LM (`is_adapter_causal_lm`):
those carry `LLM_ACTIVATION_ALLOWANCE`, every other model is planned as before."""

from __future__ import annotations

from torch import nn

from vramkit.core.planner.decisions.llm_allowance import is_adapter_causal_lm


class TinyForCausalLM(nn.Module):
    """A causal LM by transformers' naming: a body and no `lm_head` attribute."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(64, 64)
        self.adapter = nn.Linear(64, 2, bias=False)


class HeadedLM(nn.Module):
    """A causal LM by its `lm_head` (LitGPT's and nanoGPT's naming)."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(64, 64)
        self.lm_head = nn.Linear(64, 128)
        self.adapter = nn.Linear(64, 2, bias=False)


class Classifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(64, 64)
        self.classifier = nn.Linear(64, 2)


def _freeze_base(model: nn.Module) -> nn.Module:
    for name, param in model.named_parameters():
        param.requires_grad = name.startswith("adapter")
    return model


def test_a_causal_lm_with_a_frozen_base_is_an_adapter_fine_tune():
    assert is_adapter_causal_lm(_freeze_base(TinyForCausalLM()))
    assert is_adapter_causal_lm(nn.Sequential(_freeze_base(HeadedLM())))


def test_a_full_fine_tune_is_not():
    assert not is_adapter_causal_lm(HeadedLM())
    assert not is_adapter_causal_lm(TinyForCausalLM())


def test_a_frozen_classifier_is_not_a_causal_lm():
    assert not is_adapter_causal_lm(_freeze_base(Classifier()))


def test_a_fully_frozen_causal_lm_trains_nothing_and_is_not():
    model = HeadedLM()
    model.requires_grad_(False)
    assert not is_adapter_causal_lm(model)
