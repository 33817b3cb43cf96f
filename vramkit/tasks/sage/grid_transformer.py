"""The grid transformer: vramkit's SAGE student and its embedded default teacher.

Input: the grid-token sequence of an example (:mod:`vramkit.tasks.sage.grids.grid_tokens`), embedded
as
the sum of token, cell-row, cell-column, role and pair embeddings, projected to the model width
(Linear + LayerNorm + GELU), then a pre-norm transformer encoder. Outputs:

- a per-cell grid decoder: each of the 30×30 output cells starts from the encoder state of the
  query cell at the same place (a learned "outside" vector beyond the query grid) plus learned
  row/column queries, attends to the whole sequence, and gives 10 colour logits;
- a size head on the answer-slot state and the mean state: height and width logits (1..30),
  plus a learned table from the query grid's height (width) to output-height (-width) logits.

*Copy prior* (``copy_prior``, learned from there; 0 starts neutral): the table starts at
``copy_prior`` on its diagonal and every cell's logits get ``copy_prior × one-hot(query colour
at that cell)`` with a learned scale, so an untrained network answers like the copy-the-input
baseline (most ARC answers share much of the query) and training has to beat that baseline,
which validation reports next to it.

The last encoder states (``GridOutput.hidden``, one per input token) are what the teacher's
features are and what the student's distillation projector reads.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from vramkit.tasks.sage.grids.grid_outputs import (
    GridOutput,
    GridPrediction,
    grid_size,
    predict_grid,
)
from vramkit.tasks.sage.grids.grid_tokens import (
    GRID_SIDE,
    MAX_DEMOS,
    NUM_COLOURS,
    NUM_ROLES,
    PAD,
    VOCAB_SIZE,
)


def masked_mean(hidden: torch.Tensor, padding_mask: torch.Tensor) -> torch.Tensor:
    """(B, width) mean of (B, L, width) states over the non-padding positions."""
    keep = (~padding_mask).unsqueeze(-1).to(hidden.dtype)
    return (hidden * keep).sum(1) / keep.sum(1).clamp(min=1.0)


class CrossAttentionBlock(nn.Module):
    """Pre-norm cross-attention from cell queries to the encoder states, then a feed-forward."""

    def __init__(self, width: int, num_heads: int, ffn_dim: int, dropout: float) -> None:
        super().__init__()
        self.query_norm = nn.LayerNorm(width)
        self.attention = nn.MultiheadAttention(width, num_heads, dropout=dropout, batch_first=True)
        self.ffn_norm = nn.LayerNorm(width)
        self.ffn = nn.Sequential(
            nn.Linear(width, ffn_dim), nn.GELU(), nn.Dropout(dropout), nn.Linear(ffn_dim, width)
        )

    def forward(
        self, queries: torch.Tensor, memory: torch.Tensor, padding_mask: torch.Tensor
    ) -> torch.Tensor:
        attended, _ = self.attention(
            self.query_norm(queries),
            memory,
            memory,
            key_padding_mask=padding_mask,
            need_weights=False,
        )
        queries = queries + attended
        return queries + self.ffn(self.ffn_norm(queries))


class CellDecoder(nn.Module):
    """30×30×10 colour logits, one query per output cell (see the module docstring)."""

    def __init__(self, width: int, num_heads: int, ffn_dim: int, num_layers: int, dropout: float):
        super().__init__()
        self.row_queries = nn.Embedding(GRID_SIDE, width)
        self.col_queries = nn.Embedding(GRID_SIDE, width)
        self.outside = nn.Parameter(torch.zeros(width))
        self.layers = nn.ModuleList(
            CrossAttentionBlock(width, num_heads, ffn_dim, dropout) for _ in range(num_layers)
        )
        self.norm = nn.LayerNorm(width)
        self.to_colours = nn.Linear(width, NUM_COLOURS)

    def forward(
        self, memory: torch.Tensor, padding_mask: torch.Tensor, query_index: torch.Tensor
    ) -> torch.Tensor:
        batch, _, width = memory.shape
        flat_index = query_index.reshape(batch, GRID_SIDE * GRID_SIDE)
        gathered = memory.gather(1, flat_index.clamp(min=0)[..., None].expand(-1, -1, width))
        cells = torch.where((flat_index >= 0)[..., None], gathered, self.outside.to(memory.dtype))
        side = torch.arange(GRID_SIDE, device=memory.device)
        positions = self.row_queries(side)[:, None, :] + self.col_queries(side)[None, :, :]
        queries = cells + positions.reshape(1, GRID_SIDE * GRID_SIDE, width)
        for layer in self.layers:
            queries = layer(queries, memory, padding_mask)
        logits = self.to_colours(self.norm(queries))
        return logits.reshape(batch, GRID_SIDE, GRID_SIDE, NUM_COLOURS)


class GridTransformer(nn.Module):
    """Grid tokens → encoder states, cell logits and size logits (see the module docstring)."""

    def __init__(
        self,
        *,
        d_model: int = 512,
        num_layers: int = 6,
        num_heads: int = 8,
        ffn_dim: int = 2048,
        embed_dim: int | None = None,
        decoder_layers: int = 1,
        dropout: float = 0.0,
        copy_prior: float = 2.0,
    ) -> None:
        super().__init__()
        if d_model % num_heads:
            raise ValueError(f"d_model ({d_model}) must be a multiple of num_heads ({num_heads})")
        for name, value in (("num_layers", num_layers), ("decoder_layers", decoder_layers)):
            if value < 0:
                raise ValueError(f"{name} must be >= 0, got {value}")
        embed_dim = embed_dim or d_model
        self.init_kwargs: dict[str, Any] = {
            "d_model": d_model,
            "num_layers": num_layers,
            "num_heads": num_heads,
            "ffn_dim": ffn_dim,
            "embed_dim": embed_dim,
            "decoder_layers": decoder_layers,
            "dropout": dropout,
            "copy_prior": copy_prior,
        }
        self.width = d_model
        self.token_embedding = nn.Embedding(VOCAB_SIZE, embed_dim)
        self.row_embedding = nn.Embedding(GRID_SIDE + 1, embed_dim)
        self.col_embedding = nn.Embedding(GRID_SIDE + 1, embed_dim)
        self.role_embedding = nn.Embedding(NUM_ROLES, embed_dim)
        self.pair_embedding = nn.Embedding(MAX_DEMOS + 1, embed_dim)
        self.input_projection = nn.Sequential(
            nn.Linear(embed_dim, d_model), nn.LayerNorm(d_model), nn.GELU()
        )
        layer = nn.TransformerEncoderLayer(
            d_model,
            num_heads,
            ffn_dim,
            dropout=dropout,
            activation="gelu",
            batch_first=True,
            norm_first=True,
        )
        self.encoder = nn.TransformerEncoder(
            layer, num_layers, norm=nn.LayerNorm(d_model), enable_nested_tensor=False
        )
        self.cell_decoder = CellDecoder(d_model, num_heads, ffn_dim, decoder_layers, dropout)
        self.size_head = nn.Sequential(
            nn.Linear(2 * d_model, d_model), nn.GELU(), nn.Linear(d_model, 2 * GRID_SIDE)
        )
        # [height|width, query side - 1, output side - 1]
        self.size_from_query = nn.Parameter(
            copy_prior * torch.eye(GRID_SIDE).expand(2, GRID_SIDE, GRID_SIDE).clone()
        )
        self.copy_scale = nn.Parameter(torch.tensor(float(copy_prior)))

    @property
    def feature_width(self) -> int:
        """Width of the per-token features :meth:`encode_inputs` returns."""
        return self.width

    def encode_inputs(self, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """(B, L, width) last encoder states of the input tokens."""
        embedded = (
            self.token_embedding(batch["tokens"])
            + self.row_embedding(batch["rows"])
            + self.col_embedding(batch["cols"])
            + self.role_embedding(batch["roles"])
            + self.pair_embedding(batch["pairs"])
        )
        return self.encoder(
            self.input_projection(embedded), src_key_padding_mask=batch["padding_mask"]
        )

    def forward(self, batch: Mapping[str, torch.Tensor]) -> GridOutput:
        padding_mask = batch["padding_mask"]
        hidden = self.encode_inputs(batch)
        # one-hot over colours and PAD (= 10), PAD column dropped: no colour outside the query
        query_colours = F.one_hot(batch["query_grid"], PAD + 1)[..., :NUM_COLOURS]
        cell_logits = self.cell_decoder(hidden, padding_mask, batch["query_index"])
        cell_logits = cell_logits + self.copy_scale * query_colours.to(cell_logits.dtype)
        # the last real token of every sequence is the answer slot
        answer_slot = (~padding_mask).sum(1) - 1
        slot_state = hidden[torch.arange(hidden.shape[0], device=hidden.device), answer_slot]
        summary = torch.cat((slot_state, masked_mean(hidden, padding_mask)), dim=-1)
        query_side = grid_size(batch["query_grid"]) - 1
        size_prior = torch.stack(
            (self.size_from_query[0, query_side[:, 0]], self.size_from_query[1, query_side[:, 1]]),
            dim=1,
        )
        size_logits = self.size_head(summary).reshape(-1, 2, GRID_SIDE) + size_prior
        return GridOutput(hidden=hidden, cell_logits=cell_logits, size_logits=size_logits)

    def predict(self, batch: Mapping[str, torch.Tensor]) -> GridPrediction:
        """The predicted answer grids of a batch."""
        return predict_grid(self(batch), batch["query_grid"])

    def encode_and_predict(
        self, batch: Mapping[str, torch.Tensor]
    ) -> tuple[torch.Tensor, GridPrediction]:
        """:meth:`encode_inputs` and :meth:`predict` from one forward pass."""
        output = self(batch)
        return output.hidden, predict_grid(output, batch["query_grid"])
