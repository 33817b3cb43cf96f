"""An entry point's imports: the collector pauses while they run and, in a script, skips them."""

from __future__ import annotations

import gc

import pytest

from vramkit.core.run.long_lived_imports import long_lived_imports


@pytest.fixture
def collector_restored():
    enabled, frozen = gc.isenabled(), gc.get_freeze_count()
    yield
    if gc.get_freeze_count() > frozen:
        gc.unfreeze()  # what a test froze goes back to the oldest generation
    (gc.enable if enabled else gc.disable)()


def test_the_collector_pauses_inside_and_resumes_after(collector_restored):
    gc.enable()
    frozen = gc.get_freeze_count()
    with long_lived_imports(freeze=False):
        assert not gc.isenabled()
        kept = [object() for _ in range(100)]
    assert gc.isenabled()
    assert gc.get_freeze_count() == frozen  # imported by a test, not a script: nothing frozen
    assert kept


def test_a_script_run_freezes_what_is_alive(collector_restored):
    frozen = gc.get_freeze_count()
    with long_lived_imports(freeze=True):
        kept = [object() for _ in range(100)]  # what the imports would have made
    assert gc.get_freeze_count() >= frozen + len(kept)


def test_a_collector_switched_off_stays_off(collector_restored):
    gc.disable()
    with long_lived_imports(freeze=False):
        pass
    assert not gc.isenabled()
