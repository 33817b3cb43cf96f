"""The field's first SAGE student, shape for shape (44,101,928 parameters at the defaults).

Linear(2048→512) + LayerNorm + GELU on per-position input vectors, 6000 learned positions,
a 6-layer pre-norm TransformerEncoder (d=512, 8 heads, FFN 2048, no final norm), a masked mean
pool and an MLP 512→1024→2048→9000 giving 30×30×10 logits. It is kept as a reference shape for
memory planning and comparison, without the original's mistakes:

- its 2048-wide input is not the teacher's features but a code of the grid tokens (one-hot
  token id, cell row, cell column, role and pair, 97 of the 2048 inputs), so distilling into it
  teaches it something the input does not already hold;
- it has no size head, as the original had none: it answers at the query grid's size.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from vramkit.tasks.sage.grid_transformer import masked_mean
from vramkit.tasks.sage.grids.grid_outputs import GridOutput, GridPrediction, predict_grid
from vramkit.tasks.sage.grids.grid_tokens import (
    GRID_SIDE,
    MAX_DEMOS,
    NUM_COLOURS,
    NUM_ROLES,
    VOCAB_SIZE,
)

# (batch field, number of values) in the order of their one-hot blocks in the input code
_CODE_FIELDS = (
    ("tokens", VOCAB_SIZE),
    ("rows", GRID_SIDE + 1),
    ("cols", GRID_SIDE + 1),
    ("roles", NUM_ROLES),
    ("pairs", MAX_DEMOS + 1),
)
CODE_WIDTH = sum(size for _, size in _CODE_FIELDS)


class SageSeedStudent(nn.Module):
    """The original SAGE student's shape, reading grid tokens (see the module docstring)."""

    def __init__(
        self,
        *,
        input_dim: int = 2048,
        d_model: int = 512,
        num_layers: int = 6,
        num_heads: int = 8,
        ffn_dim: int = 2048,
        max_positions: int = 6000,
        decoder_dims: tuple[int, ...] = (1024, 2048),
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        if input_dim < CODE_WIDTH:
            raise ValueError(
                f"input_dim must be at least {CODE_WIDTH} (the token code), got {input_dim}"
            )
        self.init_kwargs: dict[str, Any] = {
            "input_dim": input_dim,
            "d_model": d_model,
            "num_layers": num_layers,
            "num_heads": num_heads,
            "ffn_dim": ffn_dim,
            "max_positions": max_positions,
            "decoder_dims": tuple(decoder_dims),
            "dropout": dropout,
        }
        self.width = d_model
        self.max_positions = max_positions
        self.input_linear = nn.Linear(input_dim, d_model)
        self.input_norm = nn.LayerNorm(d_model)
        self.positions = nn.Parameter(torch.empty(max_positions, d_model))
        nn.init.normal_(self.positions, std=0.02)
        layer = nn.TransformerEncoderLayer(
            d_model,
            num_heads,
            ffn_dim,
            dropout=dropout,
            activation="gelu",
            batch_first=True,
            norm_first=True,
        )
        self.encoder = nn.TransformerEncoder(layer, num_layers, enable_nested_tensor=False)
        dims = (d_model, *decoder_dims)
        decoder: list[nn.Module] = []
        for width_in, width_out in itertools.pairwise(dims):
            decoder += [nn.Linear(width_in, width_out), nn.GELU()]
        decoder.append(nn.Linear(dims[-1], GRID_SIDE * GRID_SIDE * NUM_COLOURS))
        self.decoder = nn.Sequential(*decoder)

    @property
    def feature_width(self) -> int:
        return self.width

    def _input_vectors(self, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        # Linear(2048→d) of a multi-hot code is the sum of the weight columns it selects: the
        # same numbers as building the (B, L, 2048) code, without materialising it.
        columns = self.input_linear.weight.t()
        embedded = self.input_linear.bias
        offset = 0
        for field, size in _CODE_FIELDS:
            embedded = embedded + F.embedding(batch[field] + offset, columns)
            offset += size
        return F.gelu(self.input_norm(embedded))

    def encode_inputs(self, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """(B, L, d_model) last encoder states of the input tokens."""
        length = batch["tokens"].shape[1]
        if length > self.max_positions:
            raise ValueError(
                f"sequence of {length} tokens exceeds the seed student's {self.max_positions} "
                f"learned positions: lower data.max_length"
            )
        vectors = self._input_vectors(batch) + self.positions[:length]
        return self.encoder(vectors, src_key_padding_mask=batch["padding_mask"])

    def forward(self, batch: Mapping[str, torch.Tensor]) -> GridOutput:
        hidden = self.encode_inputs(batch)
        logits = self.decoder(masked_mean(hidden, batch["padding_mask"]))
        cell_logits = logits.reshape(-1, GRID_SIDE, GRID_SIDE, NUM_COLOURS)
        return GridOutput(hidden=hidden, cell_logits=cell_logits, size_logits=None)

    def predict(self, batch: Mapping[str, torch.Tensor]) -> GridPrediction:
        """Predicted grids, at the query grid's size (the seed has no size head)."""
        return predict_grid(self(batch), batch["query_grid"])
