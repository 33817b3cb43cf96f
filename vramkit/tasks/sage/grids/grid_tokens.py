"""Grid tokens: how an ARC example's inputs become one token sequence, and its answer a target.

A sequence holds the demonstration pairs (input grid, output grid) that fit, then the query's
input grid, then one output marker, the *answer slot*, where the answer would begin. The answer
grid itself is never in the sequence: it only becomes the padded 30×30 target of the loss.

Every grid is written as a start marker followed by its rows, each row closed by ``ROW_END``.
Besides the token id, every position carries its cell row and column (``NO_POSITION`` for
markers), its role and the index of its demonstration pair, so a network can embed 2-D
positions instead of relying on sequence offsets.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum

import numpy as np

GRID_SIDE = 30  # ARC grids are 1..30 cells a side
NUM_COLOURS = 10  # colours 0..9 are token ids 0..9
PAD = 10  # padding: outside a grid and after a sequence; never a colour, ignored by the loss
ROW_END = 11  # closes every grid row
INPUT_START = 12  # opens an input grid
OUTPUT_START = 13  # opens an output grid; the last token of every sequence is one (answer slot)
VOCAB_SIZE = 14
NO_POSITION = GRID_SIDE  # row/column of tokens that are not cells (markers, and col of ROW_END)
MAX_DEMOS = 16  # demonstration pairs a sequence may hold (ARC tasks have at most 10)
# the query grid alone, at 30×30: marker + 30 rows of 31 tokens + answer slot
MIN_SEQUENCE_LENGTH = 1 + GRID_SIDE * (GRID_SIDE + 1) + 1


class Role(IntEnum):
    """What a token belongs to."""

    DEMO_INPUT = 0
    DEMO_OUTPUT = 1
    QUERY_INPUT = 2
    ANSWER_SLOT = 3


NUM_ROLES = len(Role)
QUERY_PAIR = MAX_DEMOS  # pair index of the query's tokens


@dataclass(frozen=True)
class EncodedInput:
    """The token sequence of one example's inputs (length L) and where its query cells are."""

    tokens: np.ndarray  # (L,) uint8 token ids
    rows: np.ndarray  # (L,) uint8 cell row, NO_POSITION for markers
    cols: np.ndarray  # (L,) uint8 cell column, NO_POSITION for markers and ROW_END
    roles: np.ndarray  # (L,) uint8 Role
    pairs: np.ndarray  # (L,) uint8 demonstration index, QUERY_PAIR for the query
    query_index: np.ndarray  # (30, 30) int32 sequence position of query cell (r, c), -1 outside
    query_grid: np.ndarray  # (30, 30) uint8 the query input grid, PAD outside it
    num_demos: int  # demonstration pairs that fitted

    def __len__(self) -> int:
        return int(self.tokens.shape[0])


def check_grid(grid: object, where: str) -> np.ndarray:
    """``grid`` as a (h, w) uint8 array, or ValueError naming ``where`` when it is not ARC-valid."""
    array = np.asarray(grid)
    if array.ndim != 2 or not (
        1 <= array.shape[0] <= GRID_SIDE and 1 <= array.shape[1] <= GRID_SIDE
    ):
        raise ValueError(
            f"{where}: a grid must be 2-D with sides 1..{GRID_SIDE}, got {array.shape}"
        )
    if not np.issubdtype(array.dtype, np.integer):
        raise ValueError(f"{where}: grid cells must be integers, got dtype {array.dtype}")
    if array.min() < 0 or array.max() >= NUM_COLOURS:
        raise ValueError(
            f"{where}: grid colours must be 0..{NUM_COLOURS - 1}, got {array.min()}..{array.max()}"
        )
    return array.astype(np.uint8)


def grid_length(grid: np.ndarray) -> int:
    """Tokens a grid takes in a sequence: its start marker and ``h`` rows of ``w + 1``."""
    height, width = grid.shape
    return 1 + height * (width + 1)


def pad_grid(grid: np.ndarray) -> np.ndarray:
    """The grid in the top-left corner of a (30, 30) uint8 array filled with ``PAD``."""
    padded = np.full((GRID_SIDE, GRID_SIDE), PAD, dtype=np.uint8)
    padded[: grid.shape[0], : grid.shape[1]] = grid
    return padded


class _SequenceWriter:
    def __init__(self, length: int) -> None:
        self.tokens = np.empty(length, dtype=np.uint8)
        self.rows = np.empty(length, dtype=np.uint8)
        self.cols = np.empty(length, dtype=np.uint8)
        self.roles = np.empty(length, dtype=np.uint8)
        self.pairs = np.empty(length, dtype=np.uint8)
        self.position = 0

    def marker(self, token: int, role: Role, pair: int) -> None:
        self.tokens[self.position] = token
        self.rows[self.position] = NO_POSITION
        self.cols[self.position] = NO_POSITION
        self.roles[self.position] = role
        self.pairs[self.position] = pair
        self.position += 1

    def grid(self, grid: np.ndarray, role: Role, pair: int) -> int:
        """Write the grid's cells and row ends; return the position of its first cell."""
        start_marker = OUTPUT_START if role == Role.DEMO_OUTPUT else INPUT_START
        self.marker(start_marker, role, pair)
        first_cell = self.position
        height, width = grid.shape
        block = np.full((height, width + 1), ROW_END, dtype=np.uint8)
        block[:, :width] = grid
        rows = np.repeat(np.arange(height, dtype=np.uint8), width + 1)
        cols = np.tile(np.append(np.arange(width, dtype=np.uint8), NO_POSITION), height)
        span = slice(self.position, self.position + block.size)
        self.tokens[span] = block.reshape(-1)
        self.rows[span] = rows
        self.cols[span] = cols
        self.roles[span] = role
        self.pairs[span] = pair
        self.position += block.size
        return first_cell


def encode_input(
    demos: Sequence[tuple[np.ndarray, np.ndarray]],
    query: np.ndarray,
    *,
    max_length: int,
    max_demos: int = MAX_DEMOS,
) -> EncodedInput:
    """Tokenise the demonstration pairs that fit (in order) and the query input grid.

    Demonstrations are kept from the first while the whole sequence stays within ``max_length``
    tokens and at most ``max_demos`` are used (0: no context). The query always fits because
    ``max_length`` must be at least ``MIN_SEQUENCE_LENGTH``. Grids must already be valid
    (:func:`check_grid`).
    """
    if max_length < MIN_SEQUENCE_LENGTH:
        raise ValueError(
            f"max_length must be at least {MIN_SEQUENCE_LENGTH} tokens (a 30×30 query grid "
            f"alone takes that many), got {max_length}"
        )
    if not 0 <= max_demos <= MAX_DEMOS:
        raise ValueError(f"max_demos must be in 0..{MAX_DEMOS}, got {max_demos}")
    length = grid_length(query) + 1
    kept = 0
    for demo_input, demo_output in demos[:max_demos]:
        pair_length = grid_length(demo_input) + grid_length(demo_output)
        if length + pair_length > max_length:
            break
        length += pair_length
        kept += 1

    writer = _SequenceWriter(length)
    for pair, (demo_input, demo_output) in enumerate(demos[:kept]):
        writer.grid(demo_input, Role.DEMO_INPUT, pair)
        writer.grid(demo_output, Role.DEMO_OUTPUT, pair)
    first_cell = writer.grid(query, Role.QUERY_INPUT, QUERY_PAIR)
    writer.marker(OUTPUT_START, Role.ANSWER_SLOT, QUERY_PAIR)
    assert writer.position == length

    height, width = query.shape
    query_index = np.full((GRID_SIDE, GRID_SIDE), -1, dtype=np.int32)
    query_index[:height, :width] = (
        first_cell
        + np.arange(height, dtype=np.int32)[:, None] * (width + 1)
        + np.arange(width, dtype=np.int32)[None, :]
    )
    return EncodedInput(
        tokens=writer.tokens,
        rows=writer.rows,
        cols=writer.cols,
        roles=writer.roles,
        pairs=writer.pairs,
        query_index=query_index,
        query_grid=pad_grid(query),
        num_demos=kept,
    )
