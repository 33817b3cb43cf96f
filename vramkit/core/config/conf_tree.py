"""The config tree as data: where it lives, and which node of it builds which component.

A component's config node is where ``conf/`` names its class in a ``_target_``: the node key is
the file's Hydra package (its group folder, or a ``# @package`` header) followed by the keys
above the ``_target_`` in the file (``conf/callbacks/finite_guard.yaml`` ->
``callbacks.finite_guard``, ``conf/data/arc.yaml`` -> ``data``). Components derive their node
from here, so no component writes its node's name (`node_of`); the settings schemas and the
configuration reference are derived from the same scan.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from vramkit.core.config.legacy_targets import current_target

REPO_ROOT = Path(__file__).resolve().parents[3]
"""The repository (an editable install's checkout): where ``conf/`` lives."""

PACKAGE_DIR = Path(__file__).resolve().parents[2]
"""The ``vramkit`` package folder."""


def shipped_folder(name: str) -> Path:
    """The folder ``name`` of the repository (``conf``, ``corpora``) as this vramkit has it: the
    wheel ships it as package files, ``vramkit/<name>`` (pyproject.toml's ``package-dir``
    mapping, setup.py); a checkout, an editable install included, has it at the top."""
    packaged = PACKAGE_DIR / name
    return packaged if packaged.is_dir() else REPO_ROOT / name


CONF_DIR = shipped_folder("conf")
"""The config tree: ``conf/`` of a checkout, or ``vramkit/conf`` of an installed wheel."""

_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's parser where installed


@dataclass(frozen=True)
class ConfNode:
    """A mapping of the config tree with a ``_target_``: its node key in the composed config
    ("callbacks.finite_guard"), its file relative to the tree's parent ("conf/callbacks/
    finite_guard.yaml"), its path inside the file (``("finite_guard",)``) and the target."""

    key: str
    file: str
    path: tuple[str, ...]
    target: str


def package_of(file: Path, conf_dir: Path) -> str:
    """The Hydra package of a config file: its ``# @package`` header, else its group folder
    ("" for the primary configs at the top of the tree)."""
    group = ".".join(file.relative_to(conf_dir).parent.parts)
    for line in file.read_text(encoding="utf-8").splitlines():
        if not line.startswith("#"):
            break
        if line.startswith("# @package"):
            package = line.removeprefix("# @package").strip()
            return {"_global_": "", "_group_": group}.get(package, package)
    return group


def load_yaml(file: Path) -> Any:
    """The plain content of a YAML file (None when empty)."""
    return yaml.load(file.read_text(encoding="utf-8"), Loader=_LOADER)


def target_nodes(
    content: Any, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], dict]]:
    """Every mapping below `content` with a string ``_target_``, with its path of keys (the
    ``defaults`` list, Hydra's composition order, holds no node)."""
    if not isinstance(content, dict):
        return
    if isinstance(content.get("_target_"), str):
        yield path, content
    for key, value in content.items():
        if key != "defaults":
            yield from target_nodes(value, (*path, str(key)))


@functools.cache
def conf_nodes(conf_dir: Path = CONF_DIR) -> tuple[ConfNode, ...]:
    """Every ``_target_`` node of the config tree at `conf_dir`, in file order."""
    found = []
    for file in sorted(conf_dir.rglob("*.yaml")):
        package = package_of(file, conf_dir)
        for path, node in target_nodes(load_yaml(file)):
            key = ".".join(part for part in (package, *path) if part)
            name = f"{conf_dir.name}/{file.relative_to(conf_dir).as_posix()}"
            found.append(ConfNode(key, name, path, current_target(node["_target_"])))
    return tuple(found)


def node_of(component: type, conf_dir: Path = CONF_DIR) -> str | None:
    """The node key of the config that builds `component` (or the nearest base class the tree
    names), e.g. ``callbacks.last_checkpoint`` for ``ResumeCheckpoint``; None when no config
    names it (a component built in code only) or its configs sit at different keys."""
    for cls in component.__mro__:
        name = f"{cls.__module__}.{cls.__qualname__}"
        keys = {node.key for node in conf_nodes(conf_dir) if node.target == name}
        if keys:
            return keys.pop() if len(keys) == 1 else None
    return None
