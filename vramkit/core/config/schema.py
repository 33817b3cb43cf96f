"""The project's config error and the wording its messages share.

`ConfigError` is the one error a user's config mistake raises: one message, one line per bad key,
each naming the key as the user types it (``data.batch_size``), the file the config came from and
the command-line override that set the key::

    invalid data settings (conf/data/icdar2015.yaml):
      data.bach_size: unknown key; did you mean data.batch_size?
      data.num_workers: expected int, got 'x' (str) (set by command-line override 'data.nu…=x')
      data.image_size: must be a positive int, a multiple of 32, got 100

Validation itself is pydantic's (`vramkit.core.config.settings`); the helpers below put a field's
annotation and limits in the words of a config (``'a positive int or "auto"'``, ``'in (0, 1]'``),
which pydantic's own messages do not.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel

from vramkit.core.config.source import ConfigSource, closest

Problem = tuple[str, str]
"""A key (relative to the settings' key prefix) and what is wrong with its value."""

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


def _is_union(annotation: Any) -> bool:
    return typing.get_origin(annotation) in (Union, types.UnionType)


def _flatten(annotation: Any) -> tuple[Any, ...]:
    """The members of a union (or the annotation alone), each without its constraints:
    ``Annotated[int, Field(gt=0)] | Literal["auto"]`` -> ``(int, Literal["auto"])``."""
    members = typing.get_args(annotation) if _is_union(annotation) else (annotation,)
    return tuple(
        typing.get_args(member)[0] if typing.get_origin(member) is Annotated else member
        for member in members
    )


def _is_settings(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)
