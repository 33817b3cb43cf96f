"""ARC data: split by task, the ARC-AGI-2 overlap rule, held-out answers removed from training."""

from __future__ import annotations

import numpy as np
import pytest

from vramkit.tasks.sage.data.arc_data import ArcDataSettings, load_examples
from vramkit.tasks.sage.data.arc_examples import build_examples
from vramkit.tasks.sage.data.arc_tasks import (
    ArcTask,
    check_disjoint_tasks,
    drop_held_out_pairs,
    load_arc_set,
    load_arc_split,
)


def _task(task_id: str, seed: int, pairs: int = 3) -> ArcTask:
    rng = np.random.default_rng(seed)
    grids = [
        (rng.integers(0, 10, (3, 3)).astype(np.uint8), rng.integers(0, 10, (3, 3)).astype(np.uint8))
        for _ in range(pairs)
    ]
    return ArcTask(task_id, tuple(grids[:-1]), tuple(grids[-1:]))


def test_arc_agi_1_counts_and_split_by_task():
    train = load_arc_set("arc_agi_1/training")
    evaluation = load_arc_set("arc_agi_1/evaluation")
    assert len(train) == len(evaluation) == 400
    assert sum(len(t.train) for t in train) == 1302
    assert sum(len(t.test) for t in train) == 416
    split = load_arc_split("arc_agi_1/training", "arc_agi_1/evaluation")
    assert {t.task_id for t in split.train}.isdisjoint(t.task_id for t in split.held_out)


def test_examples_keep_tasks_apart():
    train, val = load_examples(ArcDataSettings(limit_tasks=20))
    assert {e.task_id for e in train}.isdisjoint(e.task_id for e in val)
    assert all(e.key.split("/")[1].startswith("test") for e in val)


def test_held_out_answers_are_removed_from_training():
    # ARC-AGI-1 evaluation task 070dd51e's test pair is training task 40853293's test pair
    split = load_arc_split("arc_agi_1/training", "arc_agi_1/evaluation")
    (duplicate,) = (t for t in split.train if t.task_id == "40853293")
    (held_out,) = (t for t in split.held_out if t.task_id == "070dd51e")
    answer_in, answer_out = held_out.test[0]
    for grid_in, grid_out in (*duplicate.train, *duplicate.test):
        assert not (np.array_equal(grid_in, answer_in) and np.array_equal(grid_out, answer_out))
    assert len(duplicate.train) + len(duplicate.test) == 2  # of 3 pairs


def test_arc_agi_2_training_with_arc_agi_1_evaluation_is_refused():
    with pytest.raises(
        ValueError, match=r"376 task\(s\).*arc_agi_1/evaluation.*arc_agi_2/training"
    ):
        load_arc_split("arc_agi_2/training", "arc_agi_1/evaluation")


def test_arc_agi_2_pairs_with_its_own_evaluation():
    split = load_arc_split("arc_agi_2/training", "arc_agi_2/evaluation", limit_tasks=5)
    assert len(split.train) == len(split.held_out) == 5


def test_overlap_rule_on_synthetic_task_ids():
    train = [_task("aaaa0001", 1), _task("aaaa0002", 2)]
    clean = [_task("bbbb0001", 3)]
    check_disjoint_tasks(train, clean, train_name="mine", held_out_name="theirs")
    with pytest.raises(ValueError, match=r"1 task\(s\).*theirs.*mine \(aaaa0002\)"):
        check_disjoint_tasks(
            train, [_task("aaaa0002", 9)], train_name="mine", held_out_name="theirs"
        )


def test_a_verbatim_held_out_test_pair_is_dropped_from_training_only():
    held_out = _task("held0001", 5)
    copied = ArcTask("train001", (held_out.test[0], *_task("x", 6).train), _task("x", 6).test)
    untouched = _task("train002", 7)
    cleaned, removed = drop_held_out_pairs([copied, untouched], [held_out])
    assert removed == ["train001 pair 0"]
    assert len(cleaned[0].train) == len(copied.train) - 1
    assert cleaned[1] is untouched


def test_unknown_sets_name_the_key():
    with pytest.raises(ValueError, match=r"data.train_set.*arc_agi_3/training"):
        load_arc_split("arc_agi_3/training", "arc_agi_1/evaluation")
    with pytest.raises(ValueError, match="same set"):
        load_arc_split("arc_agi_1/evaluation", "arc_agi_1/evaluation")


def test_leave_one_out_examples_use_every_pair_once():
    task = _task("t0000001", 0, pairs=4)
    examples = build_examples([task], queries="all")
    assert [e.key for e in examples] == [f"t0000001/pair{i}" for i in range(4)]
    for example in examples:
        assert len(example.demos) == 3
        assert not any(np.array_equal(example.query_input, d[0]) for d in example.demos)
    assert len(build_examples([task], queries="test")) == 1
