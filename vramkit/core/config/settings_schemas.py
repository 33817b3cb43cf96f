"""The defaults of a config file's components, from their settings classes: one definition.

A config file that lists a component's keys without writing their defaults holds ``???`` for
each (with its one-line comment) and names its schema first in its defaults list::

    defaults:
      - /schema/callbacks/finite_guard@_here_
      - _self_

    finite_guard:
      _target_: vramkit.core.callbacks.finite_guard.FiniteGuard
      on_non_finite: ???  # stop | skip_step | rollback

`register_settings_schemas` stores, for every such file, a node of the file's shape with the
defaults of each ``_target_``'s settings class in place of its ``???`` in Hydra's ConfigStore
(``schema/<group>/<name>``).
Hydra composes the schema first and the file over it; OmegaConf's merge keeps the schema's value
where the file says ``???`` (omegaconf 2.3, basecontainer.py ``_map_merge``: "if src node is
missing, use the value from the dest_node"; tests/core/config/test_settings_schemas.py fails if
that changes), so the composed config holds the class's default,
and a command-line override or an experiment's value still replaces it. The class stays the one
place of a default; the YAML says which keys exist and what they do.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from pydantic import TypeAdapter
from pydantic_core import PydanticUndefined

from vramkit.core.config.component_settings import settings_class_of
from vramkit.core.config.conf_tree import CONF_DIR, load_yaml, target_nodes
from vramkit.core.config.settings import Settings

SCHEMA_GROUP = "schema"
"""The ConfigStore group of the schemas: ``schema/<group>/<name>`` for conf/<group>/<name>.yaml."""


def schema_name(file: Path, conf_dir: Path = CONF_DIR) -> str:
    """The schema's config path of a config file: ``schema/callbacks/finite_guard``."""
    return f"{SCHEMA_GROUP}/{file.relative_to(conf_dir).with_suffix('').as_posix()}"


def schema_entry(file: Path, conf_dir: Path = CONF_DIR) -> str:
    """The defaults-list entry with which a config file composes its schema under itself."""
    return f"/{schema_name(file, conf_dir)}@_here_"


def uses_schema(file: Path, content: Any, conf_dir: Path = CONF_DIR) -> bool:
    """Whether the file's defaults list names its own schema."""
    defaults = content.get("defaults", []) if isinstance(content, dict) else []
    return schema_entry(file, conf_dir) in defaults


def default_values(settings: type[Settings]) -> dict[str, Any]:
    """The class's fields that have a default, each as a config holds it (JSON: a tuple as a
    list, a path as a string, nested settings as a mapping); required fields are left out."""
    values = {}
    for name, field in settings.model_fields.items():
        default = field.get_default(call_default_factory=True)
        if default is not PydanticUndefined:
            values[name] = TypeAdapter(field.annotation).dump_python(default, mode="json")
    return values


def file_schema(content: Any) -> dict[str, Any]:
    """A node of the file's shape: at each ``_target_`` whose component has a settings class,
    the file's node with the class's defaults in place of its ``???`` (in the file's key order,
    so the composed config reads as the file does) and after it the fields the file leaves out."""
    schema: dict[str, Any] = {}
    for path, node in target_nodes(content):
        settings = settings_class_of(node["_target_"])
        if settings is None:
            continue
        place = schema
        for key in path:
            place = place.setdefault(key, {})
        place.update(_filled(node, default_values(settings)))
    return schema


def _filled(node: dict[str, Any], defaults: dict[str, Any]) -> dict[str, Any]:
    filled: dict[str, Any] = {}
    for key, value in node.items():
        if key == "defaults":  # the file's composition list, not a key of its node
            continue
        default = defaults.get(key)
        if value == "???" and key in defaults:
            filled[key] = default
        elif isinstance(value, dict) and isinstance(default, dict):
            filled[key] = _filled(value, default)
        else:  # the file's own value, which the file sets again over the schema
            filled[key] = value
    return {**filled, **{key: v for key, v in defaults.items() if key not in filled}}


@functools.cache
def settings_schemas(conf_dir: Path = CONF_DIR) -> tuple[tuple[str, dict[str, Any]], ...]:
    """``(schema name, node)`` for every file of the tree at `conf_dir` that uses a schema."""
    schemas = []
    for file in sorted(conf_dir.rglob("*.yaml")):
        content = load_yaml(file)
        if uses_schema(file, content, conf_dir):
            schemas.append((schema_name(file, conf_dir), file_schema(content)))
    return tuple(schemas)


def register_settings_schemas(conf_dir: Path = CONF_DIR) -> None:
    """Store the schemas in Hydra's ConfigStore; a composition of the tree needs them first.
    Storing again replaces them with the same nodes."""
    store = ConfigStore.instance()
    for name, node in settings_schemas(conf_dir):
        group, _, option = name.rpartition("/")
        store.store(group=group, name=option, node=node)
