"""Every YAML node of a component with a settings class agrees with that class, key by key.

A component's settings class is the one definition of its keys and defaults
(`vramkit.core.config.settings`); its YAML node uses only those keys, each with a one-line
comment, and never writes a default again: a key left at its default holds ``???`` and its file
composes the class's defaults under itself (`vramkit.core.config.settings_schemas`). Where one
node configures the component (the callbacks), that node lists every field, so every knob is in
conf/; interpolated values (``${paths.output_dir}``) are the run's, not defaults.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import TypeAdapter
from pydantic_core import PydanticUndefined

from vramkit.core.config.component_settings import NODE_KEYS, settings_class_of
from vramkit.core.config.settings import Settings
from vramkit.core.config.settings_schemas import uses_schema
from vramkit.core.config.source import closest

CONF = Path(__file__).resolve().parents[2] / "conf"


@dataclass(frozen=True)
class ComponentNode:
    """A YAML mapping with a ``_target_`` whose component has a settings class."""

    file: Path
    schema: type[Settings]
    values: dict[str, Any]
    lines: dict[str, int]  # key -> 0-based line of the key in the file
    inherited: frozenset[str]  # keys given by the configs of its defaults list

    def __str__(self) -> str:
        return f"{self.file.relative_to(CONF.parent)} ({self.schema.__name__})"


def _component_nodes(file: Path) -> list[ComponentNode]:
    found: list[ComponentNode] = []

    def walk(node: yaml.Node) -> None:
        if isinstance(node, yaml.MappingNode):
            pairs = {key.value: (key, value) for key, value in node.value}
            target = pairs.get("_target_")
            schema = settings_class_of(target[1].value) if target else None
            if schema is not None:
                values = {
                    name: yaml.safe_load(yaml.serialize(value))
                    for name, (_, value) in pairs.items()
                    if name not in NODE_KEYS
                }
                lines = {name: key.start_mark.line for name, (key, _) in pairs.items()}
                inherited = _inherited_keys(file, values.pop("defaults", []))
                found.append(ComponentNode(file, schema, values, lines, inherited))
            for _, value in node.value:
                walk(value)
        elif isinstance(node, yaml.SequenceNode):
            for value in node.value:
                walk(value)

    root = yaml.compose(file.read_text())
    if root is not None:
        walk(root)
    return found


def _inherited_keys(file: Path, defaults: list[Any]) -> frozenset[str]:
    """The keys of the same group's configs a defaults list (``[arc, _self_]``) composes in
    (a schema, ``/schema/...``, lists none)."""
    keys: set[str] = set()
    for entry in defaults:
        if isinstance(entry, str) and entry != "_self_" and not entry.startswith("/"):
            keys |= set(yaml.safe_load((file.parent / f"{entry}.yaml").read_text()))
    return frozenset(keys)


NODES = [node for file in sorted(CONF.rglob("*.yaml")) for node in _component_nodes(file)]
NODES_PER_CLASS = Counter(node.schema for node in NODES)
SINGLE = [node for node in NODES if NODES_PER_CLASS[node.schema] == 1]


def key_problems(node: ComponentNode) -> list[str]:
    """Keys that are no field (with the closest field) and keys without a one-line comment."""
    fields = node.schema.model_fields
    problems = [
        f"{key}: no field of {node.schema.__name__}; closest: {closest(key, list(fields))}"
        for key in node.values
        if key not in fields
    ]
    text = node.file.read_text().splitlines()
    for key, line in node.lines.items():
        if key == "defaults":  # Hydra's composition list, no setting
            continue
        commented = "#" in text[line] or (line > 0 and text[line - 1].lstrip().startswith("#"))
        if key not in NODE_KEYS and not commented:
            problems.append(f"{key}: no one-line comment")
    return problems


def missing_fields(node: ComponentNode) -> list[str]:
    """Fields of the class that the node (with the configs it inherits) does not list."""
    given = set(node.values) | node.inherited
    return [f"{name}: missing" for name in node.schema.model_fields if name not in given]


def repeated_defaults(node: ComponentNode) -> list[str]:
    """Plain values that are the class's default again (nested settings compared key by key)."""
    return list(_repeated(node.schema, node.values, defaults=None, prefix=""))


def _repeated(
    schema: type[Settings], values: dict[str, Any], defaults: Settings | None, prefix: str
) -> list[str]:
    problems = []
    for name, value in values.items():
        field = schema.model_fields.get(name)
        if field is None or value == "???" or (isinstance(value, str) and "${" in value):
            continue
        default = (
            field.get_default(call_default_factory=True)
            if defaults is None
            else getattr(defaults, name)
        )
        if default is PydanticUndefined:
            continue
        if isinstance(default, Settings) and isinstance(value, dict):
            problems += _repeated(type(default), value, default, f"{prefix}{name}.")
        elif TypeAdapter(field.annotation).validate_json(json.dumps(value)) == default:
            problems.append(f"{prefix}{name}: {value!r} is {schema.__name__}'s default again")
    return problems


def question_marks(node: ComponentNode) -> list[str]:
    """Keys that say ``???`` (the class's default) where that cannot work: the file composes no
    schema, or the class has no default for the key."""
    with_schema = uses_schema(
        node.file, yaml.safe_load(node.file.read_text()), node.file.parents[1]
    )
    problems = []
    for key, value in node.values.items():
        field = node.schema.model_fields.get(key)
        if value != "???" or field is None:
            continue
        if not with_schema:
            problems.append(f"{key}: ??? without the file's schema")
        elif field.get_default(call_default_factory=True) is PydanticUndefined:
            problems.append(f"{key}: ??? but {node.schema.__name__} has no default")
    return problems


def test_the_components_with_settings_classes_are_found() -> None:
    names = {node.schema.__name__ for node in NODES}
    assert {"CheckpointRetentionSettings", "FiniteGuardSettings", "RunReportSettings"} <= names
    assert {"ArcDataModuleSettings", "TextDetectionDataSettings"} <= names


@pytest.mark.parametrize("node", NODES, ids=str)
def test_every_key_is_a_field_with_a_comment(node: ComponentNode) -> None:
    assert not key_problems(node), f"{node}: {key_problems(node)}"


@pytest.mark.parametrize("node", SINGLE, ids=str)
def test_the_only_node_of_a_component_lists_every_field(node: ComponentNode) -> None:
    assert not missing_fields(node), f"{node}: {missing_fields(node)}"


@pytest.mark.parametrize("node", NODES, ids=str)
def test_no_default_is_written_twice(node: ComponentNode) -> None:
    assert not repeated_defaults(node), f"{node}: write ??? for {repeated_defaults(node)}"


@pytest.mark.parametrize("node", NODES, ids=str)
def test_a_question_mark_reads_a_class_default_through_the_files_schema(
    node: ComponentNode,
) -> None:
    assert not question_marks(node), f"{node}: {question_marks(node)}"


def test_a_node_that_disagrees_with_its_class_is_named(tmp_path: Path) -> None:
    file = tmp_path / "retention.yaml"
    file.write_text(
        "checkpoint_retention:\n"
        "  _target_: vramkit.core.callbacks.checkpoints.checkpoint_retention.CheckpointRetention\n"
        "  every_n_epochs: ???  # commented\n"
        "  keep_lst: 3  # misspelt\n"
        "  budget_gib: 5.0\n"
    )
    (node,) = _component_nodes(file)
    assert key_problems(node) == [
        "keep_lst: no field of CheckpointRetentionSettings; closest: keep_last",
        "budget_gib: no one-line comment",
    ]
    assert missing_fields(node) == [
        "keep_last: missing",
        "dirpath: missing",
        "report_path: missing",
    ]
    assert repeated_defaults(node) == [
        "budget_gib: 5.0 is CheckpointRetentionSettings's default again"
    ]
    assert question_marks(node) == ["every_n_epochs: ??? without the file's schema"]


def test_a_nested_default_written_again_is_named(tmp_path: Path) -> None:
    file = tmp_path / "arc.yaml"
    file.write_text(
        "_target_: vramkit.tasks.sage.data.arc_teacher_datamodule.ArcTeacherDataModule\n"
        "augment:\n"
        "  dihedral: true\n"
        "  colours: false\n"
    )
    (node,) = _component_nodes(file)
    assert repeated_defaults(node) == ["augment.dihedral: True is AugmentSettings's default again"]
