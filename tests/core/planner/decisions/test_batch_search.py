"""The batch-size search: exact on convex peak curves, with few evaluations."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from vramkit.core.planner.decisions.plan import largest_fitting


def counting(curve):
    calls = []

    def peak(size: int) -> int:
        calls.append(size)
        return curve(size)

    return peak, calls


def brute_force(curve, budget: int, upper: int) -> int:
    return max((size for size in range(1, upper + 1) if curve(size) <= budget), default=0)


def test_a_straight_line_takes_three_evaluations():
    peak, calls = counting(lambda size: 1000 + 37 * size)
    assert largest_fitting(peak, budget=10_000, upper=5000) == (10_000 - 1000) // 37
    assert len(calls) == 3


def convex_case(seed: int) -> tuple[Callable[[int], int], int, int]:
    """A random (curve, budget, upper): a step's peak is the largest of several moments, each a
    fixed cost + a per-sample cost."""
    rng = random.Random(seed)
    lines = [(rng.randint(0, 5000), rng.randint(0, 60)) for _ in range(rng.randint(1, 4))]
    budget = rng.randint(2000, 30_000)
    upper = rng.randint(1, 3000)
    return (lambda size: max(a + b * size for a, b in lines)), budget, upper


@pytest.mark.parametrize("seed", range(20))
def test_convex_piecewise_curves_give_the_brute_force_answer(seed):
    curve, budget, upper = convex_case(seed)
    peak, calls = counting(curve)
    assert largest_fitting(peak, budget, upper) == brute_force(curve, budget, upper)
    assert len(calls) <= 9


def test_nothing_fits_and_everything_fits():
    assert largest_fitting(lambda size: 100 + size, budget=50, upper=10) == 0
    peak, calls = counting(lambda size: 100)
    assert largest_fitting(peak, budget=500, upper=64) == 64
    assert len(calls) <= 3


@pytest.mark.parametrize("seed", range(10))
def test_upper_first_gives_the_same_answer(seed):
    curve, budget, upper = convex_case(seed)
    assert largest_fitting(curve, budget, upper, upper_first=True) == brute_force(
        curve, budget, upper
    )


def test_upper_first_settles_a_set_that_fits_whole_in_one_evaluation():
    peak, calls = counting(lambda size: 1000 + 3 * size)
    assert largest_fitting(peak, budget=10_000, upper=100, upper_first=True) == 100
    assert calls == [100]
