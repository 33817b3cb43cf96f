"""The shared plain-text table."""

from __future__ import annotations

import pytest

from vramkit.core.tables import render_table


def test_numbers_are_right_aligned_and_text_left_aligned():
    text = render_table(
        ["phase", "GiB", "note"],
        [["train", "1.500", "a"], ["validation", "12.250", "bb"]],
        title="memory",
        caption="total",
        left=["note"],
    )
    lines = text.splitlines()
    assert lines[0].strip() == "memory" and lines[-1].strip() == "total"
    train = next(line for line in lines if "train" in line)
    val = next(line for line in lines if "validation" in line)
    assert train.index("1.500") + len("1.500") == val.index("12.250") + len("12.250")  # right
    assert train.index("a ") == val.index("bb")  # left
    assert train.index("train") == val.index("validation")


def test_brackets_are_shown_not_read_as_markup_and_no_colour_codes():
    text = render_table(["file"], [["[strike]x.ckpt[/strike]"]])
    assert "[strike]x.ckpt[/strike]" in text
    assert "\x1b[" not in text


def test_a_row_of_the_wrong_length_is_refused():
    with pytest.raises(ValueError, match="2 cells for 3 columns"):
        render_table(["a", "b", "c"], [["1", "2"]])
