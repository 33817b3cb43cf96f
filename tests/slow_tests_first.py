"""The suite's order under ``pytest -n N --dist worksteal``: every worker starts with its share of
the modules that hold end-to-end (``slow``) tests, so no worker begins a minute-long run after the
other has finished everything else.

pytest-xdist's worksteal scheduler hands each worker one contiguous slice of the collected items,
``len(items) // N`` each in order (``xdist/scheduler/worksteal.py``, ``check_schedule``), and a
worker that runs out takes the last half of another's pending items. Collected in path order, the
end-to-end modules (tests/e2e) sit together in the second slice: one worker ran them all while the
other finished the unit tests and then stole only what was still pending. Here each slice begins
with a share of those modules (their slow tests counted, the largest first, given to the slice with
the fewest), and the remaining items fill the slices in their collected order, so what is left to
steal at the end is short tests.

A module moves whole and keeps its order, so a module-scoped fixture shared by its tests (one
pair of DDP runs, one uninterrupted reference run) is still set up once on one worker.
"""

from __future__ import annotations

import pytest


def _module_groups(items: list[pytest.Item]) -> tuple[list[list[pytest.Item]], list[pytest.Item]]:
    """The items of modules with a ``slow`` test, one list per module, and the other items."""
    by_module: dict[str, list[pytest.Item]] = {}
    for item in items:
        by_module.setdefault(item.nodeid.split("::", 1)[0], []).append(item)
    heavy = [
        group for group in by_module.values() if any(i.get_closest_marker("slow") for i in group)
    ]
    heavy_ids = {id(item) for group in heavy for item in group}
    return heavy, [item for item in items if id(item) not in heavy_ids]


def order_for_workers(items: list[pytest.Item], workers: int) -> list[pytest.Item]:
    """``items`` reordered so that each of ``workers`` contiguous slices of ``len(items) //
    workers`` items (the last one taking the remainder) starts with its share of the modules that
    hold slow tests; with one worker, ``items`` unchanged."""
    if workers < 2:
        return items
    heavy, light = _module_groups(items)

    def weight(group: list[pytest.Item]) -> int:
        return sum(1 for item in group if item.get_closest_marker("slow"))

    heads: list[list[pytest.Item]] = [[] for _ in range(workers)]
    loads = [0] * workers
    for group in sorted(heavy, key=weight, reverse=True):  # stable: equal weights keep path order
        lightest = loads.index(min(loads))
        heads[lightest] += group
        loads[lightest] += weight(group)
    size = len(items) // workers
    ordered: list[pytest.Item] = []
    for index, head in enumerate(heads):
        room = size - len(head) if index < workers - 1 else len(light)
        fill, light = light[: max(room, 0)], light[max(room, 0) :]
        ordered += head + fill
    return ordered + light
