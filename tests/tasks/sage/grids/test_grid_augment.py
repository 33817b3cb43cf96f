"""Augmentations: 8 distinct dihedral maps, colour 0 fixed, invertible, one per example."""

from __future__ import annotations

import numpy as np
import pytest

from vramkit.tasks.sage.data.arc_examples import ArcExample
from vramkit.tasks.sage.grids.grid_augment import (
    IDENTITY,
    GridTransform,
    dihedral_transforms,
    random_transform,
    view_transform,
)

RNG = np.random.default_rng(0)
GRID = RNG.integers(0, 10, size=(3, 5)).astype(np.uint8)


def test_the_eight_dihedral_transforms_are_distinct():
    images = {t.apply(GRID).tobytes() + bytes(t.apply(GRID).shape) for t in dihedral_transforms()}
    assert len(images) == 8


@pytest.mark.parametrize("seed", range(20))
def test_random_transforms_are_invertible_and_keep_background(seed):
    transform = random_transform(np.random.default_rng(seed))
    moved = transform.apply(GRID)
    assert np.array_equal(transform.invert(moved), GRID)
    assert transform.colours[0] == 0
    assert (moved == 0).sum() == (GRID == 0).sum()


def test_colour_permutation_must_fix_zero():
    with pytest.raises(ValueError, match="keep 0"):
        GridTransform(colours=(1, 0, 2, 3, 4, 5, 6, 7, 8, 9))
    with pytest.raises(ValueError, match="rotations"):
        GridTransform(rotations=4)


def test_one_transform_covers_every_grid_of_an_example():
    demos = tuple(
        (RNG.integers(0, 10, (2, 3)).astype(np.uint8), RNG.integers(0, 10, (3, 4)).astype(np.uint8))
        for _ in range(3)
    )
    example = ArcExample("t/test0", "t", demos, GRID, RNG.integers(0, 10, (4, 2)).astype(np.uint8))
    transform = GridTransform(rotations=1, transpose=True, colours=(0, 3, 1, 2, 9, 8, 7, 6, 5, 4))
    moved = example.transformed(transform)
    originals = [g for pair in example.demos for g in pair] + [example.query_input, example.answer]
    moved_grids = [g for pair in moved.demos for g in pair] + [moved.query_input, moved.answer]
    for original, grid in zip(originals, moved_grids, strict=True):
        assert np.array_equal(transform.invert(grid), original)
        assert np.array_equal(transform.apply(original), grid)


def test_a_rule_survives_augmentation():
    # the task "recolour 1 → 2": after any transform, the transformed colours still map alike
    grid_in = np.array([[1, 0], [0, 1]], np.uint8)
    grid_out = np.where(grid_in == 1, 2, grid_in).astype(np.uint8)
    for seed in range(10):
        t = random_transform(np.random.default_rng(seed))
        moved_in, moved_out = t.apply(grid_in), t.apply(grid_out)
        assert np.array_equal(np.where(moved_in == t.colours[1], t.colours[2], moved_in), moved_out)


def test_views_are_reproducible_and_view_zero_is_the_original():
    assert view_transform("abc/test0", 0, seed=1) == IDENTITY
    assert view_transform("abc/test0", 3, seed=1) == view_transform("abc/test0", 3, seed=1)
    distinct = {view_transform("abc/test0", v, seed=1) for v in range(1, 9)}
    assert len(distinct) > 4
    assert view_transform("abc/test0", 1, seed=1) != view_transform("abd/test0", 1, seed=1)


def test_disabled_families_give_identity():
    assert random_transform(np.random.default_rng(0), dihedral=False, colours=False).is_identity
    only_colours = random_transform(np.random.default_rng(0), dihedral=False)
    assert only_colours.rotations == 0 and not only_colours.transpose
