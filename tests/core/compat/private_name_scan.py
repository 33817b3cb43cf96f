"""Finds uses of Lightning's, torch's, Hydra's and OmegaConf's private names in Python source.

A use is: an import from a private module of those libraries or of a private name from them
(``from torch.utils._pytree import tree_flatten``, ``from lightning.fabric.utilities.types import
_Stateful``); an attribute reached from a name imported from them (``torch._foreach_norm``,
``nn.modules.batchnorm._BatchNorm``); or, on any other object but ``self``, ``cls`` and
``super()``, an attribute, or a string given to ``getattr``/``hasattr``/``setattr``, whose name
the libraries define as private (``module._trainer``, ``job_return._return_value``): those names
are read from the installed libraries' sources (``def _x``, ``class _X``, ``self._x =``). On
``self`` and ``cls`` such a name counts when the file itself defines no attribute or function of
that name: it is then inherited from the library's class (``self._trainer`` in a LightningModule).
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import re
from pathlib import Path

LIBRARIES = ("lightning", "lightning_fabric", "pytorch_lightning", "torch", "hydra", "omegaconf")
# Names that look private but are public by their library's documentation: Hydra's config keys
# and the namedtuple API (``_fields``...), which torch also defines for its own named tuples.
PUBLIC = frozenset(
    {"_target_", "_partial_", "_recursive_", "_convert_", "_args_"}
    | {"_fields", "_field_defaults", "_asdict", "_replace", "_make"}
)
_DEFINED = re.compile(r"(?:def|class)\s+(_[A-Za-z]\w*)|self\.(_[A-Za-z]\w*)\s*[:=]")
# In a file's own code: a name it defines, also with an annotation (``self._x: int = 0``).
_OWN = re.compile(r"(?:def|class)\s+(_[A-Za-z]\w*)|self\.(_[A-Za-z]\w*)\s*(?::[^=\n]*)?=")
_ATTRIBUTE_CALLS = {"getattr", "hasattr", "setattr", "delattr"}


def is_private(name: str) -> bool:
    """Whether ``name`` is private by Python's convention (one leading underscore, no dunder)."""
    return name.startswith("_") and not name.endswith("__") and name not in PUBLIC


@functools.cache
def library_private_names() -> frozenset[str]:
    """Every private function, class and instance attribute name the installed libraries define."""
    names: set[str] = set()
    for library in LIBRARIES:
        spec = importlib.util.find_spec(library)
        if spec is None or spec.origin is None:
            continue
        for path in Path(spec.origin).parent.rglob("*.py"):
            for defined, assigned in _DEFINED.findall(path.read_text(errors="ignore")):
                names.add(defined or assigned)
    return frozenset(name for name in names if is_private(name))


def _root_name(node: ast.expr) -> str | None:
    while isinstance(node, ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _is_own_object(node: ast.expr) -> bool:
    if isinstance(node, ast.Name):
        return node.id in ("self", "cls")
    call = node if isinstance(node, ast.Call) else None
    return call is not None and isinstance(call.func, ast.Name) and call.func.id == "super"


def _uses(source: str, names: frozenset[str]) -> list[tuple[int, str, tuple[str, ...]]]:
    """``(line, code, private names)`` for each use in ``source``."""
    tree = ast.parse(source)
    library_aliases: set[str] = set()
    found: list[tuple[int, str, tuple[str, ...]]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] in LIBRARIES:
                    library_aliases.add(alias.asname or parts[0])
                    if private := tuple(filter(is_private, parts)):
                        found.append((node.lineno, f"import {alias.name}", private))
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            parts = node.module.split(".")
            if parts[0] not in LIBRARIES:
                continue
            imported = [alias.name for alias in node.names]
            library_aliases.update(alias.asname or alias.name for alias in node.names)
            if private := tuple(filter(is_private, [*parts, *imported])):
                code = f"from {node.module} import {', '.join(imported)}"
                found.append((node.lineno, code, private))
    own = {defined or assigned for defined, assigned in _OWN.findall(source)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and is_private(node.attr):
            # On self/cls, a library's name counts unless this file defines it (inherited).
            libraries = node.attr in names and (
                not _is_own_object(node.value) or node.attr not in own
            )
            if libraries or _root_name(node.value) in library_aliases:
                found.append((node.lineno, ast.unparse(node), (node.attr,)))
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in _ATTRIBUTE_CALLS
            and len(node.args) > 1
            and isinstance(node.args[1], ast.Constant)
            and node.args[1].value in names
        ):
            found.append((node.lineno, ast.unparse(node), (node.args[1].value,)))
    return found


def private_uses(source: str, library_names: frozenset[str] | None = None) -> list[str]:
    """``"<line>: <code>"`` for each use of a library's private name in ``source``."""
    names = library_private_names() if library_names is None else library_names
    return [f"{line}: {code}" for line, code, _ in sorted(set(_uses(source, names)))]


def private_names_used(source: str) -> set[str]:
    """The libraries' private names that ``source`` uses (modules, attributes, imported names)."""
    return {name for *_, private in _uses(source, library_private_names()) for name in private}
