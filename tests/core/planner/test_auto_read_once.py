"""A profile's "auto" batch size is compared in one function, `batch_size_request`: every other
caller asks the `BatchSizeRequest` it returns."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import NamedTuple

PACKAGE = Path(__file__).resolve().parents[3] / "vramkit"

READER = ("core/planner/request.py", "batch_size_request")
"""The one function that compares a batch size with "auto"."""

OTHER_AUTOS = {
    "core/planner/tracing/sharding.py": "Lightning's strategy name 'auto'",
    "tasks/text_detection/evaluation/rrc_protocol.py": "the RRC evaluation's tie_breaker 'auto'",
}
"""Files whose "auto" is another setting's value, not a batch size."""


class Comparison(NamedTuple):
    file: str
    line: int
    function: str


def _is_auto(node: ast.expr) -> bool:
    if isinstance(node, ast.Constant):
        return node.value == "auto"
    if isinstance(node, ast.Name):
        return node.id == "AUTO"
    if isinstance(node, ast.Attribute):
        return node.attr == "AUTO"
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return any(_is_auto(element) for element in node.elts)
    return False


class _Finder(ast.NodeVisitor):
    def __init__(self, file: str) -> None:
        self.file, self.function, self.found = file, "<module>", []

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        outer, self.function = self.function, node.name
        self.generic_visit(node)
        self.function = outer

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Compare(self, node: ast.Compare) -> None:
        if any(_is_auto(operand) for operand in (node.left, *node.comparators)):
            self.found.append(Comparison(self.file, node.lineno, self.function))
        self.generic_visit(node)


def auto_comparisons(root: Path = PACKAGE) -> list[Comparison]:
    """Every comparison with "auto" (or a name `AUTO`) in the Python files under `root`."""
    found = []
    for file in sorted(root.rglob("*.py")):
        finder = _Finder(file.relative_to(root).as_posix())
        finder.visit(ast.parse(file.read_text(encoding="utf-8")))
        found += finder.found
    return found


def test_auto_is_compared_in_batch_size_request_alone():
    batch_sizes = [c for c in auto_comparisons() if c.file not in OTHER_AUTOS]
    assert [(c.file, c.function) for c in batch_sizes] == [READER]


def test_the_other_autos_are_still_compared_where_listed():
    # a file listed here that no longer compares "auto" must leave the list
    assert {c.file for c in auto_comparisons()} - {READER[0]} == set(OTHER_AUTOS)


def test_the_finder_sees_each_form_of_a_comparison_with_auto(tmp_path):
    (tmp_path / "settle.py").write_text(
        "def resolve(profile):\n"
        "    if profile.batch_size == AUTO:\n"
        "        return 1\n"
        "    return 'auto' in (profile.val_batch_size,) or hw.AUTO != 2\n"
        "wants = AUTO in (a, b)\n"
    )
    assert auto_comparisons(tmp_path) == [
        Comparison("settle.py", 2, "resolve"),
        Comparison("settle.py", 4, "resolve"),
        Comparison("settle.py", 4, "resolve"),
        Comparison("settle.py", 5, "<module>"),
    ]
