"""The defaults of a config file's components, from their settings classes: one definition.

A config file that lists a component's keys without writing their defaults holds ``???`` for
each (with its one-line comment) and names its schema after itself in its defaults list::

    defaults:
      - _self_
      - /schema/callbacks/finite_guard@_here_

    finite_guard:
      _target_: vramkit.core.callbacks.finite_guard.FiniteGuard
      on_non_finite: ???  # stop | skip_step | rollback

`register_settings_schemas` stores, for every such file, its ``???`` keys, each as
``${settings_default:<target>,<key>}``, in Hydra's ConfigStore (``schema/<group>/<name>``).
Hydra merges the schema over the file, so every ``???`` becomes that interpolation (the file's
own values stay: the schema holds no other key), and a later config or a command-line override
replaces it as any value. The ``settings_default`` resolver reads the default from the target's
settings class when the value is read: composing imports no component (no Lightning, no other
task's module), and the class stays the one place of a default; the YAML says which keys exist
and what they do. A component without a settings class (a task's network or LightningModule, a
data module of random samples) keeps its defaults in its signature, and a ``???`` of its node
reads the default from there (`vramkit.core.config.component_settings.signature_default`).

A later config that sets such a key makes OmegaConf read the interpolation while merging
(basecontainer.py ``_map_merge``, ``_maybe_dereference_node``): that imports the component
(torch, transformers) while composing. A key that a shipped config merges over therefore keeps
its value in the file (tests/conf/test_signature_defaults.py lists them, and checks that
composing each task imports no task module).
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf
from pydantic import TypeAdapter
from pydantic_core import PydanticUndefined

from vramkit.core.config.component_settings import (
    defaults_target,
    settings_class_of,
    signature_default,
)
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


def class_default(target: str, key: str) -> Any:
    """The default of `key` (dotted below nested settings: ``augment.dihedral``) in the settings
    class of the component `target` names, or, for a component without one, in its signature
    (`signature_default`), as a config holds it (plain JSON values). Raises `ValueError` when
    neither has that default."""
    settings = settings_class_of(target)
    if settings is None:
        return signature_default(target, key)
    value: Any = default_values(settings)
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            raise ValueError(f"{settings.__name__} has no default for {key}")
        value = value[part]
    return value


def settings_default(target: str, key: str) -> Any:
    """The ``settings_default`` resolver: `class_default`, a list or mapping as a ListConfig or
    DictConfig."""
    value = class_default(target, key)
    # a list or mapping as a config node: resolving a config in place (``--cfg job --resolve``,
    # OmegaConf.resolve) puts a container only where an interpolation gave one (omegaconf/_impl.py)
    return OmegaConf.create(value) if isinstance(value, list | dict) else value


OWN_COMPONENTS = ("vramkit.",)
"""The targets whose class defaults a run folder's or a checkpoint's record may have read: its
strings are data, and reading a default imports the target's module (`with_class_defaults`)."""

_CLASS_DEFAULT = re.compile(r"\$\{settings_default:([^,{}]+),([^,{}]+)\}")


def with_class_defaults(data: Any, components: tuple[str, ...] | None = None) -> Any:
    """`data` (plain dicts and lists, as a config holds them unresolved) with each value that is
    exactly ``${settings_default:<target>,<key>}`` replaced by that class default, so a config
    composed under the schemas compares by value with one that wrote the numbers (a run recorded
    before them). Nothing else is resolved: a run folder's ``${run_folder:…}`` reads the disk
    (its files are data), and ``${hw.…}`` compares as written. `components`: the target prefixes
    allowed (a record's: `OWN_COMPONENTS`), None for any; another target, or one without that
    default, stays as written."""
    if isinstance(data, dict):
        return {key: with_class_defaults(value, components) for key, value in data.items()}
    if isinstance(data, list):
        return [with_class_defaults(value, components) for value in data]
    found = _CLASS_DEFAULT.fullmatch(data) if isinstance(data, str) else None
    if found is None:
        return data
    target, key = (part.strip() for part in found.groups())
    if components is not None and not target.startswith(components):
        return data
    try:
        return class_default(target, key)
    except ValueError:
        return data


def file_schema(content: Any) -> dict[str, Any]:
    """The ``???`` keys of the file's ``_target_`` nodes, each as the interpolation that reads
    the class's default (nested settings keys included: ``augment.dihedral``); another library's
    component names vramkit's settings class for it (`defaults_target`)."""
    schema: dict[str, Any] = {}
    for path, node in target_nodes(content):
        place = schema
        for key in path:
            place = place.setdefault(key, {})
        place.update(_filled(node, defaults_target(node["_target_"]), ""))
    return schema


def _filled(node: dict[str, Any], target: str, prefix: str) -> dict[str, Any]:
    filled: dict[str, Any] = {}
    for key, value in node.items():
        if value == "???":
            filled[key] = f"${{settings_default:{target},{prefix}{key}}}"
        elif isinstance(value, dict) and "_target_" not in value and key != "defaults":
            nested = _filled(value, target, f"{prefix}{key}.")
            if nested:
                filled[key] = nested
    return filled


@functools.cache
def settings_schemas(conf_dir: Path = CONF_DIR) -> tuple[tuple[str, dict[str, Any]], ...]:
    """``(schema name, node)`` for every file of the tree at `conf_dir` that uses a schema."""
    schemas = []
    for file in sorted(conf_dir.rglob("*.yaml")):
        if f"/{SCHEMA_GROUP}/" not in file.read_text(encoding="utf-8"):
            continue  # read the YAML of the few files that name a schema only
        content = load_yaml(file)
        if uses_schema(file, content, conf_dir):
            schemas.append((schema_name(file, conf_dir), file_schema(content)))
    return tuple(schemas)


def register_settings_schemas(conf_dir: Path = CONF_DIR, *, as_values: bool = False) -> None:
    """Store the schemas in Hydra's ConfigStore and register the ``settings_default`` resolver;
    a composition of the tree needs them first. Storing again replaces the nodes.

    `as_values`: the schemas hold the class defaults themselves, not the interpolations, for a
    composition a person reads as text (``--cfg job``, which prints it unresolved): that imports
    every component the tree names (all tasks), which a run's composition must not."""
    if not OmegaConf.has_resolver("settings_default"):
        OmegaConf.register_new_resolver("settings_default", settings_default)
    store = ConfigStore.instance()
    for name, node in settings_schemas(conf_dir):
        group, _, option = name.rpartition("/")
        store.store(group=group, name=option, node=with_class_defaults(node) if as_values else node)
