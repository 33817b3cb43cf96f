"""Which bitsandbytes release a plan applies, and its version rules."""

from __future__ import annotations

import pytest

from vramkit.core.quantization import bitsandbytes_rules
from vramkit.core.quantization.bitsandbytes_rules import (
    NEWEST_TESTED_BITSANDBYTES,
    bitsandbytes_rules_of,
    keeps_4bit_input,
    optimizer_8bit_block,
    planned_bitsandbytes,
)


def test_the_installed_release_is_planned_else_the_newest_tested(monkeypatch):
    monkeypatch.setattr(bitsandbytes_rules, "installed_bitsandbytes", lambda: "0.45.5")
    assert planned_bitsandbytes().version == "0.45.5"
    monkeypatch.setattr(bitsandbytes_rules, "installed_bitsandbytes", lambda: None)
    planned = planned_bitsandbytes()
    assert planned.version == NEWEST_TESTED_BITSANDBYTES
    assert f"bitsandbytes {NEWEST_TESTED_BITSANDBYTES}" in planned.footer()
    with bitsandbytes_rules_of("0.42.0"):
        assert planned_bitsandbytes().version == "0.42.0"
    assert planned_bitsandbytes().version == NEWEST_TESTED_BITSANDBYTES


@pytest.mark.parametrize(
    ("version", "warns"), [("0.50.2", False), ("0.41.3", False), ("0.40.2", True), ("0.51.0", True)]
)
def test_one_warning_line_outside_the_tested_range(version, warns):
    with bitsandbytes_rules_of(version):
        warning = planned_bitsandbytes().warning()
    assert (warning is not None) == warns
    if warns:
        assert "\n" not in warning and version in warning


def test_version_rules():
    assert keeps_4bit_input("0.43.1") and keeps_4bit_input("0.41.0")
    assert not keeps_4bit_input("0.43.2") and not keeps_4bit_input("0.50.2")
    assert optimizer_8bit_block("0.43.3") == 2048 and optimizer_8bit_block("0.44.0") == 256


def test_a_malformed_version_is_refused():
    with pytest.raises(ValueError), bitsandbytes_rules_of("latest"):
        pass
