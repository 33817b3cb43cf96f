"""The configuration reference: every config node's keys, types, defaults and docs, generated.

``python -m vramkit.config_reference`` writes docs/configuration_reference.md from the one
definition of each key, its settings class (`vramkit.core.config.settings`); ``--check`` writes
nothing and exits 1 when the committed page differs from what the classes say (the CI check,
also run by tests/docs/test_configuration_reference.py). The component nodes are found in the
config tree (`vramkit.core.config.conf_tree`); the nodes without a ``_target_`` are listed in
`PLAIN_NODES`.
"""

from __future__ import annotations

import argparse
import sys
import typing
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import TypeAdapter
from pydantic_core import PydanticUndefined

from vramkit.core.callbacks.memory.oom_fault_injection import FaultSettings
from vramkit.core.config.component_settings import settings_class_of
from vramkit.core.config.conf_tree import CONF_DIR, REPO_ROOT, conf_nodes
from vramkit.core.config.schema import bounds_in_words, describe_type
from vramkit.core.config.settings import Settings, field_limits
from vramkit.core.config.trainer_schema import TrainerSettings
from vramkit.core.hardware.profile import HardwareProfile

REFERENCE = REPO_ROOT / "docs" / "configuration_reference.md"
"""The committed page."""

PLAIN_NODES: dict[str, tuple[type[Settings], str]] = {
    "hw": (HardwareProfile, "conf/hw/*.yaml, or `+hw=<profile>`"),
    "trainer": (TrainerSettings, "conf/trainer/*.yaml (the keys vramkit checks)"),
    "fault": (FaultSettings, "the command line: `+fault.oom_train_above=N`"),
}
"""Config nodes that no ``_target_`` builds: their key, settings class and where they are set."""


@dataclass(frozen=True)
class Section:
    """One node of the reference: its key, settings class and where its values come from."""

    key: str
    settings: type[Settings]
    origin: str


def sections(conf_dir: Path = CONF_DIR) -> list[Section]:
    """The component nodes with a settings class (one section per node key and class, naming
    its files and target), then `PLAIN_NODES`, each group in key order."""
    found: dict[tuple[str, type[Settings]], list[str]] = {}
    for node in conf_nodes(conf_dir):
        settings = settings_class_of(node.target)
        if settings is not None:
            found.setdefault((node.key, settings), []).append(f"`{node.file}` ({node.target})")
    components = [
        Section(key, settings, "; ".join(dict.fromkeys(origins)))
        for (key, settings), origins in found.items()
    ]
    plain = [Section(key, settings, origin) for key, (settings, origin) in PLAIN_NODES.items()]
    return sorted(components, key=lambda s: (s.key, s.settings.__name__)) + plain


def rows(settings: type[Settings], prefix: str = "") -> Iterator[tuple[str, str, str, str]]:
    """``(key, type, default, doc)`` per field; a nested settings class adds its own rows."""
    for name, field in settings.model_fields.items():
        default = field.get_default(call_default_factory=True)
        shown = "required" if default is PydanticUndefined else f"`{_as_yaml(field, default)}`"
        doc = " ".join((field.description or "").split())
        bounds = bounds_in_words(field.annotation, field_limits(field))
        kind = describe_type(field.annotation)
        if bounds:  # "a positive int" says the type itself
            kind = bounds if bounds.startswith("a positive") else f"{kind}; {bounds}"
        yield f"`{prefix}{name}`", kind, shown, doc
        nested = _nested_settings(field.annotation)
        if nested is not None:
            yield from rows(nested, f"{prefix}{name}.")


def render(conf_dir: Path = CONF_DIR) -> str:
    """The reference page as Markdown."""
    lines = [
        "# Configuration reference",
        "",
        "Every config node vramkit checks: its keys, what each may hold, its default and what it",
        "does. Generated from the settings classes, the one place a default is written, by",
        "`python -m vramkit.config_reference`; do not edit by hand (CI fails when this page and",
        "the classes differ). In conf/, a key at its default says `???`: the file composes the",
        "class's defaults under itself (`vramkit/core/config/settings_schemas.py`).",
    ]
    for section in sections(conf_dir):
        lines += [
            "",
            f"## `{section.key}` ({section.settings.__name__})",
            "",
            f"Set in {section.origin}.",
            "",
            "| key | type | default | what it does |",
            "|---|---|---|---|",
        ]
        lines += [
            "| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |"
            for row in rows(section.settings)
        ]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """Write the page, or with ``--check`` compare it: 0 when equal, 1 (and a message) when not."""
    parser = argparse.ArgumentParser(prog="python -m vramkit.config_reference", description=__doc__)
    parser.add_argument("--check", action="store_true", help="compare only; exit 1 on a change")
    args = parser.parse_args(argv)
    page = render()
    if not args.check:
        REFERENCE.write_text(page, encoding="utf-8")
        return 0
    if REFERENCE.is_file() and REFERENCE.read_text(encoding="utf-8") == page:
        return 0
    print(
        f"{REFERENCE.relative_to(REPO_ROOT)} differs from the settings classes: "
        "run python -m vramkit.config_reference and commit it",
        file=sys.stderr,
    )
    return 1


def _as_yaml(field: Any, value: Any) -> str:
    plain = TypeAdapter(field.annotation).dump_python(value, mode="json")
    return (
        yaml.safe_dump(plain, default_flow_style=True, allow_unicode=True)
        .strip()
        .removesuffix("\n...")
    )


def _nested_settings(annotation: Any) -> type[Settings] | None:
    members = typing.get_args(annotation) or (annotation,)
    return next((m for m in members if isinstance(m, type) and issubclass(m, Settings)), None)


if __name__ == "__main__":
    raise SystemExit(main())
