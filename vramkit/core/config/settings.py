"""Typed settings: one frozen pydantic model per configured object, the one definition of its keys.

A settings class states each key once, with its type, default, limits and a one-line doc (the
attribute docstring becomes the field's ``description``)::

    class CheckpointRetentionSettings(Settings):
        keep_last: int = Field(3, ge=1)
        \"\"\"Periodic checkpoints kept (the newest).\"\"\"

A component names its settings class in ``settings_class``, takes its keys as keyword arguments
(so a config node's keys reach it unchanged through ``_target_``) and keeps them validated in
``self.settings``; its signature and docstring do not repeat them::

    class CheckpointRetention(L.Callback):
        settings_class = CheckpointRetentionSettings

        def __init__(self, **settings: Any) -> None:
            self.settings = CheckpointRetentionSettings.for_component(type(self), settings)

``for_component`` finds the component's config node in the config tree (the ``_target_`` that
names its class, `vramkit.core.config.conf_tree.node_of`): the keys as the user types them
(``callbacks.checkpoint_retention.keep_last``) and the file and overrides they came from follow,
and no component writes its node's name. The defaults live here only: the config file holds
``???`` for them (`vramkit.core.config.settings_schemas`).

Pydantic validates; `from_config` only translates its errors into one `ConfigError` in the
project's wording (key as the user types it, the file, the override that set it, the closest valid
key, the allowed range or choices): that translation is our own code because pydantic's messages
("Extra inputs are not permitted", "Input should be greater than or equal to 1") name neither the
config file, nor the override, nor the key the user meant.

Config values are validated as JSON, strictly: that is the form of a config (a YAML or
command-line value), so a str is a path and a list a tuple, but a bool is no int and "3" no
number. Rules that involve several fields go in ``cross_field_problems(self)`` returning
``(field, problem)`` pairs, because a pydantic model validator reports one error without a key.
"""

from __future__ import annotations

import json
import types
import typing
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, Self

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException
from pydantic import BaseModel, BeforeValidator, ConfigDict, ValidationError, model_validator
from pydantic.fields import FieldInfo

from vramkit.core.config.conf_tree import node_of
from vramkit.core.config.schema import (
    ConfigError,
    Problem,
    allowed_values,
    bounds_in_words,
    choice_problem,
    describe_type,
    settings_error,
    settings_heading,
)
from vramkit.core.config.source import ConfigSource, closest, source_of

LIMIT_NAMES = ("ge", "gt", "le", "lt", "multiple_of")
"""The numeric constraints of a pydantic ``Field`` that the error messages put in words."""

_RANGE_ERRORS = {
    "greater_than",
    "greater_than_equal",
    "less_than",
    "less_than_equal",
    "multiple_of",
    "finite_number",
}


def _non_empty(value: Any) -> Any:
    if value == "":
        raise ValueError("expected a non-empty path, got ''")
    return value


ConfigPath = Annotated[Path, BeforeValidator(_non_empty)]
"""The type of a path setting: pydantic takes "" as ``Path(".")``, the working folder, which no
config means; a small validator of our own refuses it."""


class CrossFieldProblems(ValueError):
    """The ``(field, problem)`` pairs a settings class's ``cross_field_problems`` found."""

    def __init__(self, problems: list[Problem]) -> None:
        super().__init__("; ".join(f"{key}: {problem}" for key, problem in problems))
        self.problems = problems


class Settings(BaseModel):
    """Base of every settings class: frozen (and hashable), unknown keys refused, docs from the
    attribute docstrings. Built in code (``Settings(key=value)``) it converts as pydantic's lax
    mode does (a list into a tuple, 20 into 20.0) and fails with pydantic's ValidationError;
    `from_config` is strict and fails with a `ConfigError`."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    def cross_field_problems(self) -> list[Problem]:
        """Problems of several fields together, as ``(field, problem)`` pairs (none here)."""
        return []

    @model_validator(mode="after")
    def _check_cross_field_rules(self) -> Self:
        problems = self.cross_field_problems()
        if problems:
            raise CrossFieldProblems(problems)
        return self

    @classmethod
    def from_config(
        cls,
        values: Mapping[str, Any] | DictConfig,
        *,
        key_prefix: str,
        source: ConfigSource | None = None,
        title: str | None = None,
    ) -> Self:
        """`values` validated into these settings, or one `ConfigError` listing every problem.

        `key_prefix` is how the user addresses these keys ("callbacks.checkpoint_retention.");
        `source` names the file and overrides they came from (`source_of`); `title` replaces the
        first line's "invalid <prefix> settings". Interpolations of a DictConfig are resolved.
        """
        heading = settings_heading(cls, key_prefix, title)
        plain = _plain(values, heading, key_prefix, source)
        try:
            return cls.model_validate_json(json.dumps(plain, default=str), strict=True)
        except ValidationError as error:
            problems = list(_problems(error, cls, plain, key_prefix))
            raise settings_error(problems, heading, key_prefix, source) from None

    @classmethod
    def from_node(cls, values: Mapping[str, Any] | DictConfig, *, node: str) -> Self:
        """`from_config` for the keys of the config node `node` ("callbacks.finite_guard",
        "data"): addressed as `<node>.<key>`, from the file and overrides `source_of` names
        (its config group is the node's first part, the callback's config its second)."""
        group, _, name = node.partition(".")
        return cls.from_config(
            values, key_prefix=f"{node}.", source=source_of(group, node=name or None)
        )

    @classmethod
    def for_component(cls, component: type, values: Mapping[str, Any] | DictConfig) -> Self:
        """`from_node` at the config node whose ``_target_`` builds `component` (or its nearest
        configured base class); a component no config names has its keys addressed bare, under
        the heading "invalid <class> settings"."""
        node = node_of(component)
        if node is None:
            return cls.from_config(
                values, key_prefix="", title=f"invalid {component.__name__} settings"
            )
        return cls.from_node(values, node=node)


def field_limits(info: FieldInfo) -> dict[str, Any]:
    """The numeric constraints of a field as a mapping: ``Field(ge=1)`` -> ``{"ge": 1}``; those
    of its items too (``tuple[Annotated[int, Field(ge=1)], ...]``)."""
    constraints = list(info.metadata)
    for arg in typing.get_args(info.annotation):
        for extra in getattr(arg, "__metadata__", ()):
            constraints += getattr(extra, "metadata", [extra])
    return {
        name: getattr(constraint, name)
        for constraint in constraints
        for name in LIMIT_NAMES
        if getattr(constraint, name, None) is not None
    }


def _plain(
    values: Mapping[str, Any] | DictConfig,
    heading: str,
    key_prefix: str,
    source: ConfigSource | None,
) -> dict[str, Any]:
    """The values as plain dicts and lists; Hydra hands a component ListConfig values."""
    if not isinstance(values, Mapping | DictConfig):
        where = f" ({source.file})" if source else ""
        raise ConfigError(
            f"{heading}{where}: {key_prefix.rstrip('.') or 'the config'} must be a mapping of "
            f"keys, got {values!r} ({type(values).__name__})"
        )
    try:
        if isinstance(values, DictConfig):
            return OmegaConf.to_container(values, resolve=True)
        return {
            key: OmegaConf.to_container(value, resolve=True)
            if isinstance(value, DictConfig | ListConfig)
            else value
            for key, value in values.items()
        }
    except OmegaConfBaseException as error:
        where = f" ({source.file})" if source else ""
        raise ConfigError(f"{heading}{where}: cannot resolve the config: {error}") from None


def _problems(
    error: ValidationError, schema: type[Settings], values: Mapping[str, Any], key_prefix: str
) -> Iterator[Problem]:
    """One problem per key, worded from the field's annotation and limits."""
    by_key: dict[tuple[str, ...], list[dict[str, Any]]] = {}
    for detail in error.errors(include_url=False):
        by_key.setdefault(_key_path(schema, detail), []).append(detail)
    for path, details in by_key.items():
        key = ".".join(path)
        cross = next(
            (
                d["ctx"]["error"]
                for d in details
                if isinstance(d.get("ctx", {}).get("error"), CrossFieldProblems)
            ),
            None,
        )
        if cross is not None:
            nested = f"{key}." if key else ""
            yield from ((f"{nested}{name}", problem) for name, problem in cross.problems)
            continue
        yield key, _problem(schema, path, details, values, key_prefix)


def _key_path(schema: type[Settings], detail: dict[str, Any]) -> tuple[str, ...]:
    """The field names of an error's location; union members and list indices left out."""
    path: list[str] = []
    model: type[BaseModel] | None = schema
    for part in detail["loc"]:
        if model is not None and part in model.model_fields:
            path.append(str(part))
            model = _settings_member(model.model_fields[str(part)].annotation)
        elif detail["type"] == "extra_forbidden" and model is not None:
            path.append(str(part))
            break
        else:
            break
    return tuple(path)


def _problem(
    schema: type[Settings],
    path: tuple[str, ...],
    details: list[dict[str, Any]],
    values: Mapping[str, Any],
    key_prefix: str,
) -> str:
    kinds = {detail["type"] for detail in details}
    owner, info = _field(schema, path)
    if "extra_forbidden" in kinds:
        hint = closest(path[-1], list(owner.model_fields))
        nested = "".join(f"{part}." for part in path[:-1])
        return f"unknown key; did you mean {key_prefix}{nested}{hint}?" if hint else "unknown key"
    if info is None:  # a rule of the model as a whole
        return "; ".join(str(detail["msg"]) for detail in details)
    if "missing" in kinds:
        return f"missing (a required {describe_type(info.annotation)})"
    given = _given(values, path)
    limits = field_limits(info)
    if kinds & _RANGE_ERRORS:
        if isinstance(given, list | tuple):
            return f"every value must be {bounds_in_words(info.annotation, limits)}, got {given}"
        return f"must be {allowed_values(info.annotation, limits)}, got {given!r}"
    choices = _literal_choices(info.annotation, given)
    if choices:
        members = _members(info.annotation)
        if all(typing.get_origin(m) is Literal or m is type(None) for m in members):
            return choice_problem(given, choices)
        return f"must be {allowed_values(info.annotation, limits)}, got {given!r}"
    if "value_error" in kinds or "assertion_error" in kinds:
        return "; ".join(str(detail["ctx"]["error"]) for detail in details if "ctx" in detail)
    return f"expected {describe_type(info.annotation)}, got {given!r} ({type(given).__name__})"


def _field(
    schema: type[BaseModel], path: tuple[str, ...]
) -> tuple[type[BaseModel], FieldInfo | None]:
    """The model that holds the last key of `path`, and that key's field (None if unknown)."""
    model = schema
    for part in path[:-1]:
        model = _settings_member(model.model_fields[part].annotation) or model
    return model, model.model_fields.get(path[-1]) if path else None


def _given(values: Mapping[str, Any], path: tuple[str, ...]) -> Any:
    value: Any = values
    for part in path:
        value = value.get(part) if isinstance(value, Mapping) else None
    return value


def _literal_choices(annotation: Any, given: Any) -> tuple[Any, ...]:
    """The Literal choices of `annotation` when `given` has their type but is none of them."""
    choices = tuple(
        arg
        for member in _members(annotation)
        if typing.get_origin(member) is Literal
        for arg in typing.get_args(member)
    )
    return choices if any(type(given) is type(choice) for choice in choices) else ()


def _members(annotation: Any) -> tuple[Any, ...]:
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return typing.get_args(annotation)
    return (annotation,)


def _settings_member(annotation: Any) -> type[BaseModel] | None:
    """The settings class among the annotation's members (``X | None``), if there is one."""
    return next(
        (m for m in _members(annotation) if isinstance(m, type) and issubclass(m, BaseModel)),
        None,
    )
