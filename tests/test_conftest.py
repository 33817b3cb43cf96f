"""The suite's own guards in ``tests/conftest.py`` do what they say, checked in an inner session."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

CONFTEST = Path(__file__).resolve().parent / "conftest.py"

# The first test leaves a handler on the root logger bound to its own captured stderr, as a
# Hydra job run in-process does; pytest closes that stream when the test ends.
LEAVES_A_HANDLER = """
import logging
import sys


def test_a_job_leaves_its_console_handler(capsys):
    logging.getLogger().addHandler(logging.StreamHandler(sys.stderr))


def test_a_later_warning_prints_cleanly(capsys):
    logging.getLogger("later").warning("a warning")
    assert "Logging error" not in capsys.readouterr().err
"""


def test_a_handler_a_test_leaves_on_the_root_logger_is_gone_before_the_next_test(
    pytester: pytest.Pytester,
) -> None:
    pytester.makeconftest(CONFTEST.read_text())
    pytester.makepyfile(test_inner=LEAVES_A_HANDLER)
    result = pytester.runpytest_inprocess("-p", "no:xdist", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)
