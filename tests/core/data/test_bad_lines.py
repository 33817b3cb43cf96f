"""One file's input problems are a few warning lines and one count, once per process."""

from __future__ import annotations

import warnings

import pytest

from vramkit.core.data.bad_lines import DETAILED_LINES_PER_FILE, warn_file_problems


def _warned(path, problems) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warn_file_problems(path, problems, UserWarning)
    return [str(w.message) for w in caught]


def test_a_flood_is_a_few_lines_then_one_count_by_kind(tmp_path):
    path = tmp_path / "gt_img_1.txt"
    path.write_text("x")
    problems = [("geometry_clipped", f"{path}:{n}: clipped") for n in range(1, 9001)]
    problems += [("bad_lines", f"{path}:{n}: line skipped") for n in range(9001, 10001)]
    messages = _warned(path, problems)
    assert messages[:DETAILED_LINES_PER_FILE] == [m for _, m in problems[:DETAILED_LINES_PER_FILE]]
    assert messages[DETAILED_LINES_PER_FILE:] == [
        f"{path}: 9995 more problems in this file not shown (8995 geometry_clipped, "
        "1000 bad_lines); 10000 in all, each counted in the bad-input record"
    ]


@pytest.mark.parametrize("count", [1, DETAILED_LINES_PER_FILE])
def test_a_few_problems_are_each_warned_without_a_count(tmp_path, count):
    path = tmp_path / "gt.txt"
    path.write_text("x")
    problems = [("bad_lines", f"{path}:{n}: line skipped") for n in range(count)]
    assert _warned(path, problems) == [m for _, m in problems]


def test_a_file_read_again_unchanged_is_not_warned_again(tmp_path):
    path = tmp_path / "gt.txt"
    path.write_text("x")
    problems = [("bad_lines", f"{path}:1: line skipped")]
    assert len(_warned(path, problems)) == 1
    assert _warned(path, problems) == []  # the plan's read, then the run's: warned once
