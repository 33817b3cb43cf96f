"""The suite's order for two xdist workers: each slice starts with its share of the modules that
hold slow tests, and a module stays whole."""

from __future__ import annotations

from dataclasses import dataclass

from tests.slow_tests_first import order_for_workers


@dataclass(frozen=True)
class _Item:
    nodeid: str
    slow: bool = False

    def get_closest_marker(self, name: str) -> object | None:
        return object() if name == "slow" and self.slow else None


def _items() -> list[_Item]:
    fast = [_Item(f"tests/a/test_unit{m}.py::test_{i}") for m in range(4) for i in range(5)]
    e2e = [
        _Item("tests/e2e/test_big.py::test_shared_fixture_one", slow=True),
        _Item("tests/e2e/test_big.py::test_fast_neighbour"),
        _Item("tests/e2e/test_big.py::test_shared_fixture_two", slow=True),
        _Item("tests/e2e/test_small.py::test_run", slow=True),
    ]
    return [*fast, *e2e]


def test_each_slice_starts_with_slow_modules_kept_whole():
    items = _items()
    ordered = order_for_workers(items, 2)
    assert sorted(i.nodeid for i in ordered) == sorted(i.nodeid for i in items)
    half = len(items) // 2
    first, second = ordered[:half], ordered[half:]
    # the module with two slow tests starts one slice, whole and in order; the other, the other
    assert [i.nodeid for i in first[:3]] == [i.nodeid for i in items[20:23]]
    assert second[0].nodeid == "tests/e2e/test_small.py::test_run"
    # the rest keep their collected order
    rest = [i for i in ordered if "e2e" not in i.nodeid]
    assert rest == items[:20]


def test_one_worker_keeps_the_collected_order():
    items = _items()
    assert order_for_workers(items, 1) == items
