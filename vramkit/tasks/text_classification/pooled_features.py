"""The pooled feature of a Hugging Face sequence classifier: what its ``score`` head reads.

``*ForSequenceClassification`` applies ``score`` to every position of the last hidden state
(after the final layer norm) and keeps the logits of the rightmost token that is not padding
(``GenericForSequenceClassification.forward`` in transformers' ``modeling_layers.py``). Asking
for ``output_hidden_states=True`` returns that state as ``hidden_states[-1]``; indexing it at
the same token gives the (B, hidden) vector whose ``score`` is the returned logits.
"""

from __future__ import annotations

import torch
from torch import nn


def last_non_padding_index(input_ids: torch.Tensor, pad_token_id: int | None) -> torch.Tensor:
    """(B,) index of the rightmost token that is not ``pad_token_id`` (the last one without a
    padding id), the position the classifier pools."""
    if pad_token_id is None:
        return torch.full(input_ids.shape[:1], input_ids.shape[-1] - 1, device=input_ids.device)
    positions = torch.arange(input_ids.shape[-1], device=input_ids.device)
    return (positions * (input_ids != pad_token_id)).argmax(dim=-1)


def logits_and_pooled_features(
    model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Class logits (B, C) and the pooled final hidden state (B, hidden) of one forward."""
    output = model(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True)
    hidden = output.hidden_states[-1]
    index = last_non_padding_index(input_ids, model.config.pad_token_id)
    rows = torch.arange(hidden.shape[0], device=hidden.device)
    return output.logits, hidden[rows, index]
