"""Every name a compat module offers says in its docstring the version it was checked on, a
version that pyproject.toml's pin admits."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

import vramkit

REPO = Path(vramkit.__file__).resolve().parents[1]
COMPAT = REPO / "vramkit" / "core" / "compat"
DISTRIBUTIONS = {
    "lightning": "lightning",
    "torch": "torch",
    "hydra": "hydra-core",
    "omegaconf": "omegaconf",
}


def offered_names(module: ast.Module) -> dict[str, str | None]:
    """Each public function and module-level name with its docstring (attribute docstrings:
    the string right after the assignment)."""
    docs: dict[str, str | None] = {}
    body = module.body
    for index, node in enumerate(body):
        if isinstance(node, ast.FunctionDef) and not node.name.startswith("_"):
            docs[node.name] = ast.get_docstring(node)
        elif isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
            if name.startswith("_"):
                continue
            following = body[index + 1] if index + 1 < len(body) else None
            is_doc = isinstance(following, ast.Expr) and isinstance(following.value, ast.Constant)
            docs[name] = following.value.value if is_doc else None
    return docs


def pin(distribution: str) -> Requirement:
    text = (REPO / "pyproject.toml").read_text()
    line = re.search(rf'^\s*"({re.escape(distribution)}[<>=!].*?)",', text, re.M)
    return Requirement(line.group(1))


@pytest.mark.parametrize("library", sorted(DISTRIBUTIONS))
def test_every_offered_name_says_which_admitted_version_it_was_checked_on(library):
    distribution = DISTRIBUTIONS[library]
    docs = offered_names(ast.parse((COMPAT / f"{library}_private.py").read_text()))
    assert docs
    for name, doc in docs.items():
        checked = re.search(rf"Checked on\s+{re.escape(distribution)}\s+(\d+\.\d+\.\d+)", doc or "")
        assert checked, f"{library}_private.{name}: no 'Checked on {distribution} X.Y.Z'"
        assert pin(distribution).specifier.contains(Version(checked.group(1))), name
