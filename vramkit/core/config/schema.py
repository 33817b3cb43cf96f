"""Typed settings: one frozen dataclass per configured object, checked against a config mapping.

The annotation of a field states the type a key takes, and the field's metadata its limits::

    @dataclass(frozen=True, kw_only=True)
    class LoaderSettings:
        batch_size: int = field(default=8, metadata={"gt": 0})
        \"\"\"Samples per step and device.\"\"\"

`check_settings` turns a mapping (a plain dict or a Hydra DictConfig) into such a dataclass, or
raises one `ConfigError` that lists every problem at once, one line per key, each naming the key
as the user types it (``data.batch_size``), the file the config came from and the command-line
override that set the key::

    invalid data settings (conf/data/icdar2015.yaml):
      data.bach_size: unknown key; did you mean data.batch_size?
      data.num_workers: expected int, got 'x' (str) (set by command-line override 'data.nu…=x')
      data.image_size: must be a positive int, a multiple of 32, got 100

Annotations understood: ``bool``; ``int`` (a bool is refused); ``float`` (an int is accepted and
stored as float); ``str``; ``Path`` (a non-empty str is accepted and stored as Path); ``None``;
``Literal[...]``; unions such as ``X | None`` or ``int | Literal["auto"]``; ``tuple[X, ...]``,
``tuple[X, Y]`` and ``list[X]`` (a list is stored as the annotated container); ``dict`` /
``Mapping``; ``Any``; and nested settings dataclasses, given as a mapping and checked key by key
under ``<key>.``.

Metadata understood (`LIMITS`): ``ge``, ``gt``, ``le``, ``lt`` and ``multiple_of`` bound a number
(every number of a tuple or list); ``choices`` lists the values a key may take.

Rules that involve several fields go in a method ``cross_field_problems(self)`` of the dataclass,
returning ``(field, problem)`` pairs; they run once every field has the right type and limits.

The components' settings are pydantic models (`vramkit.core.config.settings`), which reuse the
wording below; this validator remains for the hardware profile and the trainer keys until they
move to pydantic too.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar, Union

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from vramkit.core.config.source import ConfigSource, closest

T = TypeVar("T")

Problem = tuple[str, str]
"""A key (relative to the settings' key prefix) and what is wrong with its value."""

LIMITS = ("ge", "gt", "le", "lt", "multiple_of", "choices")
"""Field metadata keys that `check_settings` enforces."""

_NONE = type(None)


class ConfigError(ValueError):
    """A config that cannot be used; the message names each bad key, its file and its override.

    `problems` holds the ``(key, problem)`` pairs (keys without the settings' key prefix) in the
    order they were found; `keys` their keys.
    """

    def __init__(
        self, message: str, keys: tuple[str, ...] = (), *, problems: tuple[Problem, ...] = ()
    ) -> None:
        super().__init__(message)
        self.problems = problems
        self.keys = keys or tuple(key for key, _ in problems)


def check_settings(
    values: Mapping[str, Any] | DictConfig,
    schema: type[T],
    *,
    key_prefix: str,
    source: ConfigSource | None = None,
    title: str | None = None,
) -> T:
    """`values` checked against the settings dataclass `schema`, returned as that dataclass.

    `key_prefix` is how the user addresses these keys ("data.", "callbacks.max_time_annealing.");
    `source` names the file and overrides they came from (see `source_of`); `title` replaces the
    first line's "invalid <prefix> settings". Unknown keys (with the closest valid key), missing
    required keys, wrong types, values outside the field's limits and the schema's cross-field
    rules are all reported in one `ConfigError`. Interpolations of a DictConfig are resolved.
    """
    heading = settings_heading(schema, key_prefix, title)
    plain = values
    if isinstance(values, DictConfig):
        try:
            plain = OmegaConf.to_container(values, resolve=True)
        except OmegaConfBaseException as error:
            where = f" ({source.file})" if source else ""
            raise ConfigError(f"{heading}{where}: cannot resolve the config: {error}") from None
    if not isinstance(plain, Mapping):
        where = f" ({source.file})" if source else ""
        raise ConfigError(
            f"{heading}{where}: {key_prefix.rstrip('.') or 'the config'} must be a mapping of "
            f"keys, got {plain!r} ({type(plain).__name__})"
        )
    settings, problems = _check_mapping(plain, schema, "", key_prefix)
    if problems:
        raise settings_error(problems, heading, key_prefix, source)
    return settings


def describe_type(annotation: Any) -> str:
    """The annotation as a config user reads it: 'int or "auto"', 'float or null', 'bool'."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is Annotated:  # a pydantic field's constrained type
        return describe_type(args[0])
    if annotation is _NONE or annotation is None:
        return "null"
    if annotation is Any:
        return "any value"
    if annotation is Path:
        return "path"
    if origin is Literal:
        return " or ".join(f'"{arg}"' if isinstance(arg, str) else repr(arg) for arg in args)
    if _is_union(annotation):
        return " or ".join(describe_type(member) for member in args)
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return f"list of {describe_type(args[0])}"
        return f"[{', '.join(describe_type(arg) for arg in args)}]"
    if origin in (list, Sequence):
        return f"list of {describe_type(args[0])}" if args else "list"
    if origin in (dict, Mapping) or annotation in (dict, Mapping) or _is_settings(annotation):
        return "mapping"
    return getattr(annotation, "__name__", str(annotation))


# ---------------------------------------------------------------------------------------------
# Checking


class _WrongType(Exception):
    """The value's type fits no member of the annotation."""


class _NotAChoice(Exception):
    """The value has the type of a Literal's choices but is none of them.

    `among_types`: the Literal shares a union with types ('int or "auto"'), so the message
    states everything allowed rather than only the choices.
    """

    def __init__(self, choices: tuple[Any, ...], *, among_types: bool = False) -> None:
        super().__init__()
        self.choices = choices
        self.among_types = among_types


def _check_mapping(
    values: Mapping[str, Any], schema: type[T], nested: str, key_prefix: str
) -> tuple[T | None, list[Problem]]:
    """The settings built from `values`, or None and the problems (keys under `nested`)."""
    fields = _init_fields(schema)
    hints = _hints(schema)
    problems: list[Problem] = []
    for key in values:
        if key not in fields:
            hint = closest(str(key), list(fields))
            suggestion = f"; did you mean {key_prefix}{nested}{hint}?" if hint else ""
            problems.append((f"{nested}{key}", f"unknown key{suggestion}"))
    checked: dict[str, Any] = {}
    for key, value in values.items():
        if key in fields:
            checked[key], found = _check_value(
                f"{nested}{key}", value, hints[key], fields[key].metadata, key_prefix
            )
            problems += found
    for name, field in fields.items():
        required = field.default is dataclasses.MISSING
        if required and field.default_factory is dataclasses.MISSING and name not in values:
            expected = describe_type(hints[name])
            problems.append((f"{nested}{name}", f"missing (a required {expected})"))
    if problems:
        return None, problems
    try:
        settings = schema(**checked)
    except ConfigError as error:
        # A schema that checks itself in __post_init__ reports its own keys.
        return None, [(f"{nested}{key}", problem) for key, problem in error.problems]
    rule_problems = _cross_field_problems(settings)
    return settings, [(f"{nested}{key}", problem) for key, problem in rule_problems]


def _check_value(
    key: str, value: Any, annotation: Any, limits: Mapping[str, Any], key_prefix: str
) -> tuple[Any, list[Problem]]:
    value = _plain(value)
    nested = _settings_member(annotation)
    if nested is not None and isinstance(value, Mapping):
        return _check_mapping(value, nested, f"{key}.", key_prefix)
    try:
        converted = _conform(value, annotation)
    except _NotAChoice as refused:
        if refused.among_types:
            return value, [(key, f"must be {allowed_values(annotation, limits)}, got {value!r}")]
        return value, [(key, choice_problem(value, refused.choices))]
    except _WrongType:
        got = f"got {value!r} ({type(value).__name__})"
        return value, [(key, f"expected {describe_type(annotation)}, {got}")]
    problem = _limit_problem(converted, value, annotation, limits)
    return converted, [(key, problem)] if problem else []


def _conform(value: Any, annotation: Any) -> Any:
    """`value` in the annotated form; raises _WrongType or _NotAChoice when it does not fit."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if annotation is Any:
        return value
    if annotation is _NONE or annotation is None:
        if value is None:
            return None
        raise _WrongType
    if origin is Literal:
        if any(value == arg and type(value) is type(arg) for arg in args):
            return value
        if any(type(value) is type(arg) for arg in args):
            raise _NotAChoice(args)
        raise _WrongType
    if _is_union(annotation):
        return _conform_union(value, args)
    if annotation is bool:
        if isinstance(value, bool):
            return value
        raise _WrongType
    if annotation is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise _WrongType
    if annotation is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        raise _WrongType
    if annotation is Path:
        if isinstance(value, str | os.PathLike) and str(value):
            return Path(value)
        raise _WrongType
    if origin is tuple:
        return tuple(_conform_items(value, args))
    if origin in (list, Sequence):
        return list(_conform_items(value, (args[0], Ellipsis) if args else (Any, Ellipsis)))
    if origin in (dict, Mapping) or annotation in (dict, Mapping):
        if isinstance(value, Mapping):
            return dict(value)
        raise _WrongType
    if isinstance(annotation, type) and isinstance(value, annotation):
        return value
    raise _WrongType


def _conform_union(value: Any, members: tuple[Any, ...]) -> Any:
    choices: list[Any] = []
    for member in members:
        try:
            return _conform(value, member)
        except _NotAChoice as refused:
            choices += refused.choices
        except _WrongType:
            pass
    if choices:
        only_choices = all(typing.get_origin(m) is Literal or m is _NONE for m in members)
        raise _NotAChoice(tuple(choices), among_types=not only_choices)
    raise _WrongType


def _conform_items(value: Any, args: tuple[Any, ...]) -> list[Any]:
    if not isinstance(value, list | tuple):
        raise _WrongType
    if len(args) == 2 and args[1] is Ellipsis:
        item_types = [args[0]] * len(value)
    elif len(args) == len(value):
        item_types = list(args)
    else:
        raise _WrongType
    try:
        return [_conform(item, kind) for item, kind in zip(value, item_types, strict=True)]
    except _NotAChoice:
        raise _WrongType from None


def _limit_problem(
    value: Any, given: Any, annotation: Any, limits: Mapping[str, Any]
) -> str | None:
    """What is wrong with the conformed `value` (as the user `given` it), or None."""
    if "choices" in limits and value is not None and value not in limits["choices"]:
        return choice_problem(given, tuple(limits["choices"]))
    many = isinstance(value, list | tuple)
    numbers = [v for v in (value if many else [value]) if _is_number(v)]
    if not all(_within(number, limits) for number in numbers):
        if many:
            return f"every value must be {bounds_in_words(annotation, limits)}, got {list(given)}"
        return f"must be {allowed_values(annotation, limits)}, got {given!r}"
    return None


def _within(number: float, limits: Mapping[str, Any]) -> bool:
    checks = (
        ("ge", lambda bound: number >= bound),
        ("gt", lambda bound: number > bound),
        ("le", lambda bound: number <= bound),
        ("lt", lambda bound: number < bound),
        ("multiple_of", lambda bound: number % bound == 0),
    )
    return all(check(limits[name]) for name, check in checks if name in limits)


# ---------------------------------------------------------------------------------------------
# Wording


def allowed_values(annotation: Any, limits: Mapping[str, Any]) -> str:
    """What a key may hold, limits included: '≥ 1', 'a positive int or "auto"', '≥ 1 or null'."""
    bounds = bounds_in_words(annotation, limits)
    parts: list[str] = []
    for member in _flatten(annotation):
        part = bounds if bounds and member in (int, float) else describe_type(member)
        if part not in parts:
            parts.append(part)
    return " or ".join(parts)


def bounds_in_words(annotation: Any, limits: Mapping[str, Any]) -> str:
    """The numeric limits in words: 'a positive int', '≥ 1', 'in (0, 1]', 'a multiple of 32'."""
    low = ("ge", limits["ge"]) if "ge" in limits else ("gt", limits.get("gt"))
    high = ("le", limits["le"]) if "le" in limits else ("lt", limits.get("lt"))
    parts = []
    if low[1] is not None and high[1] is not None:
        opening, closing = "[" if low[0] == "ge" else "(", "]" if high[0] == "le" else ")"
        parts.append(f"in {opening}{low[1]}, {high[1]}{closing}")
    elif low == ("gt", 0):
        parts.append(f"a positive {_numeric_noun(annotation)}")
    elif low[1] is not None:
        parts.append(f"{'≥' if low[0] == 'ge' else '>'} {low[1]}")
    elif high[1] is not None:
        parts.append(f"{'≤' if high[0] == 'le' else '<'} {high[1]}")
    if "multiple_of" in limits:
        parts.append(f"a multiple of {limits['multiple_of']}")
    return ", ".join(parts)


def _numeric_noun(annotation: Any) -> str:
    members = _flatten(annotation)
    return "int" if int in members and float not in members else "number"


def choice_problem(value: Any, choices: tuple[Any, ...]) -> str:
    names = [str(choice) for choice in choices]
    hint = closest(str(value), names)
    suggestion = f"; did you mean '{hint}'?" if hint else ""
    return f"{value!r} is not one of {', '.join(names)}{suggestion}"


def settings_heading(schema: type, key_prefix: str, title: str | None) -> str:
    return title or f"invalid {key_prefix.rstrip('.') or schema.__name__} settings"


def settings_error(
    problems: list[Problem], heading: str, key_prefix: str, source: ConfigSource | None
) -> ConfigError:
    lines = [f"{heading} ({source.file}):" if source else f"{heading}:"]
    for key, problem in problems:
        setter = source.override_for(f"{key_prefix}{key}") if source else None
        origin = f" (set by command-line override '{setter}')" if setter else ""
        lines.append(f"  {key_prefix}{key}: {problem}{origin}")
    return ConfigError("\n".join(lines), problems=tuple(problems))


# ---------------------------------------------------------------------------------------------
# Annotations


@functools.cache
def _hints(schema: type) -> dict[str, Any]:
    return typing.get_type_hints(schema)


@functools.cache
def _init_fields(schema: type) -> dict[str, dataclasses.Field]:
    fields = {field.name: field for field in dataclasses.fields(schema) if field.init}
    for field in fields.values():
        # A misspelt limit ("gte") would silently check nothing.
        unknown = sorted(set(field.metadata) - set(LIMITS))
        if unknown:
            raise TypeError(f"{schema.__name__}.{field.name}: unknown limit(s) {unknown}")
    return fields


def _is_union(annotation: Any) -> bool:
    return typing.get_origin(annotation) in (Union, types.UnionType)


def _flatten(annotation: Any) -> tuple[Any, ...]:
    return typing.get_args(annotation) if _is_union(annotation) else (annotation,)


def _is_settings(annotation: Any) -> bool:
    return isinstance(annotation, type) and dataclasses.is_dataclass(annotation)


def _settings_member(annotation: Any) -> type | None:
    """The settings dataclass among the annotation's members (`X | None`), if there is one."""
    return next((member for member in _flatten(annotation) if _is_settings(member)), None)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _cross_field_problems(settings: Any) -> list[Problem]:
    rules = getattr(settings, "cross_field_problems", None)
    return list(rules()) if rules is not None else []


def _plain(value: Any) -> Any:
    """Hydra containers as plain dicts and lists (interpolations resolved)."""
    if isinstance(value, DictConfig | ListConfig):
        return OmegaConf.to_container(value, resolve=True)
    return value
