"""docs/configuration_reference.md is generated from the settings classes: the CI check."""

from __future__ import annotations

from pydantic import Field

from vramkit import config_reference
from vramkit.core.callbacks.finite_guard import FiniteGuardSettings
from vramkit.core.config.settings import Settings


def test_the_committed_reference_is_the_generated_one() -> None:
    committed = config_reference.REFERENCE.read_text(encoding="utf-8")
    assert committed == config_reference.render(), (
        "docs/configuration_reference.md differs from the settings classes: "
        "run python -m vramkit.config_reference and commit it"
    )
    assert config_reference.main(["--check"]) == 0


def test_a_changed_default_makes_the_check_fail(monkeypatch, capsys) -> None:
    class Changed(FiniteGuardSettings):
        max_non_finite_in_a_row: int = Field(5, ge=1)
        """skip_step, rollback: non-finite steps in a row that are tolerated."""

    original = config_reference.sections

    def changed_sections(*args):
        return [
            config_reference.Section(s.key, Changed, s.origin)
            if s.settings is FiniteGuardSettings
            else s
            for s in original(*args)
        ]

    monkeypatch.setattr(config_reference, "sections", changed_sections)
    assert config_reference.main(["--check"]) == 1
    assert "run python -m vramkit.config_reference" in capsys.readouterr().err


def test_every_component_node_with_settings_has_a_section() -> None:
    keys = {(s.key, s.settings.__name__) for s in config_reference.sections()}
    assert ("callbacks.last_checkpoint", "ResumeCheckpointSettings") in keys
    assert ("data", "TextDetectionDataSettings") in keys
    assert ("hw", "HardwareProfile") in keys


def test_rows_give_type_limits_default_and_doc_nested_keys_included() -> None:
    class Inner(Settings):
        depth: int = Field(2, ge=1)
        """Levels | kept."""

    class Outer(Settings):
        name: str
        """Required name."""
        inner: Inner = Inner()
        """Nested settings."""

    assert list(config_reference.rows(Outer)) == [
        ("`name`", "str", "required", "Required name."),
        ("`inner`", "mapping", "`{depth: 2}`", "Nested settings."),
        ("`inner.depth`", "int; ≥ 1", "`2`", "Levels | kept."),
    ]
