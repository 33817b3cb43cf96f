"""The package's shape: no import cycle inside a package, annotations included.

import-linter's contracts (pyproject.toml) leave out imports under ``if TYPE_CHECKING:``; a cycle
made of those still ties two modules together for a reader and a type checker, so this test
counts them: where an annotation needs the other side, a Protocol names what it uses.
"""

from __future__ import annotations

import itertools
from collections import defaultdict

import grimp
import pytest


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    return grimp.build_graph("vramkit", exclude_type_checking_imports=False)


def sibling_cycles(graph: grimp.ImportGraph) -> list[tuple[str, str]]:
    """Pairs of modules (or subpackages, with all they hold) of one package that import each
    other, directly or through any chain of modules."""
    children = defaultdict(list)
    for module in graph.modules:
        children[module.rpartition(".")[0]].append(module)
    return [
        (first, second)
        for parent, siblings in sorted(children.items())
        if parent
        for first, second in itertools.combinations(sorted(siblings), 2)
        if graph.chain_exists(first, second, as_packages=True)
        and graph.chain_exists(second, first, as_packages=True)
    ]


def test_no_package_holds_an_import_cycle(graph: grimp.ImportGraph) -> None:
    assert sibling_cycles(graph) == []


def test_a_cycle_is_found() -> None:
    graph = grimp.build_graph("vramkit", exclude_type_checking_imports=False)
    graph.add_import(importer="vramkit.core.oom.policy", imported="vramkit.core.oom.guarded_steps")
    assert ("vramkit.core.oom.guarded_steps", "vramkit.core.oom.policy") in sibling_cycles(graph)
