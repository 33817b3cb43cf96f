"""Grid tokens: layout, padding distinct from colour 0, demonstrations trimmed, no answer leak."""

from __future__ import annotations

import numpy as np
import pytest

from vramkit.tasks.sage.data.arc_examples import (
    ArcExample,
    EncodingSettings,
    example_inputs,
    example_item,
)
from vramkit.tasks.sage.grids.grid_tokens import (
    GRID_SIDE,
    INPUT_START,
    MIN_SEQUENCE_LENGTH,
    NO_POSITION,
    NUM_COLOURS,
    OUTPUT_START,
    PAD,
    ROW_END,
    Role,
    check_grid,
    encode_input,
)


def _grid(height: int, width: int, start: int = 0) -> np.ndarray:
    return ((np.arange(height * width).reshape(height, width) + start) % NUM_COLOURS).astype(
        np.uint8
    )


def test_special_tokens_are_not_colours():
    assert {PAD, ROW_END, INPUT_START, OUTPUT_START}.isdisjoint(range(NUM_COLOURS))
    assert len({PAD, ROW_END, INPUT_START, OUTPUT_START}) == 4


def test_query_alone_layout_and_query_index():
    query = _grid(2, 3)
    encoded = encode_input([], query, max_length=MIN_SEQUENCE_LENGTH)
    expected = [INPUT_START, 0, 1, 2, ROW_END, 3, 4, 5, ROW_END, OUTPUT_START]
    assert encoded.tokens.tolist() == expected
    assert encoded.roles[-1] == Role.ANSWER_SLOT
    assert encoded.cols[4] == NO_POSITION and encoded.rows[4] == 0
    # every query cell points at its own token
    for row in range(2):
        for col in range(3):
            assert encoded.tokens[encoded.query_index[row, col]] == query[row, col]
    assert (encoded.query_index[2:, :] == -1).all() and (encoded.query_index[:, 3:] == -1).all()
    assert encoded.query_grid[0, 0] == 0 and encoded.query_grid[2, 0] == PAD


def test_colour_zero_cells_are_not_padding():
    encoded = encode_input([], np.zeros((3, 3), np.uint8), max_length=MIN_SEQUENCE_LENGTH)
    assert (encoded.query_grid[:3, :3] == 0).all()
    assert (encoded.query_grid[3:, :] == PAD).all()


def test_demonstrations_that_do_not_fit_are_left_out_in_order():
    query = _grid(30, 30)  # 932 tokens: nothing else fits in 1000
    demo = (_grid(3, 3), _grid(3, 3, 1))  # 13 + 13 tokens
    assert encode_input([demo] * 3, query, max_length=MIN_SEQUENCE_LENGTH).num_demos == 0
    small = _grid(2, 2)
    assert encode_input([demo] * 3, small, max_length=MIN_SEQUENCE_LENGTH).num_demos == 3
    assert (
        encode_input([demo] * 3, small, max_length=MIN_SEQUENCE_LENGTH, max_demos=1).num_demos == 1
    )
    encoded = encode_input([demo] * 2, query, max_length=MIN_SEQUENCE_LENGTH + 26)
    assert encoded.num_demos == 1 and len(encoded) == MIN_SEQUENCE_LENGTH + 26


def test_max_length_below_a_full_query_is_refused():
    with pytest.raises(ValueError, match="at least 932"):
        encode_input([], _grid(2, 2), max_length=900)


def test_the_answer_never_reaches_the_input_sequence():
    demo = (_grid(2, 2), _grid(2, 2, 3))
    base = ArcExample("t/test0", "t", (demo,), _grid(3, 3), _grid(4, 5))
    other = ArcExample("t/test0", "t", (demo,), _grid(3, 3), _grid(1, 1, 7))
    settings = EncodingSettings()
    first, second = example_inputs(base, settings), example_inputs(other, settings)
    assert np.array_equal(first.tokens, second.tokens)
    item = example_item(base, settings)
    assert item["target_size"].tolist() == [4, 5]
    assert (item["target"][4:, :] == PAD).all() and (item["target"][:, 5:] == PAD).all()


def test_context_none_drops_demonstrations():
    demo = (_grid(2, 2), _grid(2, 2, 3))
    example = ArcExample("t/test0", "t", (demo,), _grid(3, 3), _grid(3, 3))
    assert example_inputs(example, EncodingSettings(context="none")).num_demos == 0
    assert example_inputs(example, EncodingSettings(context="demos")).num_demos == 1
    with pytest.raises(ValueError, match=r"data\.context: 'everything' is not one of demos, none"):
        EncodingSettings.from_config({"context": "everything"}, key_prefix="data.")


@pytest.mark.parametrize(
    ("grid", "message"),
    [
        (np.zeros((0, 3), np.int64), "sides"),
        (np.zeros((31, 3), np.int64), "sides"),
        (np.full((2, 2), 10), "colours"),
        (np.zeros((2, 2), np.float32), "integers"),
    ],
)
def test_invalid_grids_name_where(grid, message):
    with pytest.raises(ValueError, match=rf"task x.*{message}"):
        check_grid(grid, "task x")


def test_grid_side_is_arc_maximum():
    assert GRID_SIDE == 30 and MIN_SEQUENCE_LENGTH == 1 + 30 * 31 + 1
