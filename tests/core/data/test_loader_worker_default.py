"""The default number of loader workers is written once: `DEFAULT_NUM_WORKERS`."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

from vramkit.core.data.loaders import DEFAULT_NUM_WORKERS, LoaderSettings
from vramkit.core.hardware.profile import HardwareProfile
from vramkit.tasks.hf_models.data import _RandomDataModule

PACKAGE = Path(__file__).resolve().parents[3] / "vramkit"


def written_defaults(source: str) -> list[int]:
    """Lines where a ``num_workers`` field or parameter gets a number as its default."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        pairs: list[tuple[str, ast.expr | None]] = []
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            pairs.append((node.target.id, node.value))
        elif isinstance(node, ast.arguments):
            positional = node.posonlyargs + node.args
            pairs += zip(
                [a.arg for a in positional[len(positional) - len(node.defaults) :]],
                node.defaults,
                strict=True,
            )
            pairs += [(a.arg, d) for a, d in zip(node.kwonlyargs, node.kw_defaults, strict=True)]
        for name, value in pairs:
            if name != "num_workers" or value is None:
                continue
            if isinstance(value, ast.Call) and value.args:  # Field(<default>, ...)
                value = value.args[0]
            if isinstance(value, ast.Constant) and isinstance(value.value, int):
                lines.append(node.lineno if hasattr(node, "lineno") else value.lineno)
    return lines


def test_no_module_writes_a_number_as_the_default() -> None:
    found = {
        str(file.relative_to(PACKAGE)): lines
        for file in sorted(PACKAGE.rglob("*.py"))
        if (lines := written_defaults(file.read_text(encoding="utf-8")))
    }
    assert found == {}, f"write DEFAULT_NUM_WORKERS instead: {found}"


def test_a_written_default_is_found() -> None:
    source = (
        "class S:\n    num_workers: int = Field(2, ge=0)\n"
        "def f(*, num_workers: int = 0): ...\n"
        "def g(num_workers=DEFAULT_NUM_WORKERS): ...\n"
    )
    assert written_defaults(source) == [2, 3]


def test_every_default_is_the_one_value() -> None:
    assert LoaderSettings().num_workers == DEFAULT_NUM_WORKERS
    profile = HardwareProfile(name="x", accelerator="cpu", precision="32-true")
    assert profile.num_workers == DEFAULT_NUM_WORKERS
    parameter = inspect.signature(_RandomDataModule).parameters["num_workers"]
    assert parameter.default == DEFAULT_NUM_WORKERS
