"""The package's shape: no package of more than 20 modules, and no import cycle inside a package
(annotations included).

import-linter's contracts (pyproject.toml) leave out imports under ``if TYPE_CHECKING:``; a cycle
made of those still ties two modules together for a reader and a type checker, so this test
counts them: where an annotation needs the other side, a Protocol names what it uses.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from pathlib import Path

import grimp
import pytest

import vramkit

MOST_MODULES = 20
"""Modules (and subpackages) one package may hold before it is split by job (issue #35)."""


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


def crowded_packages(root: Path) -> dict[str, int]:
    """Packages under ``root`` holding more than MOST_MODULES modules and subpackages."""
    crowded = {}
    for init in sorted(root.rglob("__init__.py")):
        folder = init.parent
        modules = [p for p in folder.glob("*.py") if p.name != "__init__.py"]
        subpackages = [p for p in folder.iterdir() if (p / "__init__.py").is_file()]
        if len(modules) + len(subpackages) > MOST_MODULES:
            crowded[str(folder.relative_to(root.parent))] = len(modules) + len(subpackages)
    return crowded


def test_no_package_holds_more_than_twenty_modules() -> None:
    assert crowded_packages(Path(vramkit.__file__).parent) == {}


def test_a_crowded_package_is_found(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    for index in range(MOST_MODULES):
        (package / f"m{index}.py").write_text("")
    assert crowded_packages(package) == {}
    (package / "extra.py").write_text("")
    assert crowded_packages(package) == {"pkg": MOST_MODULES + 1}
