"""`task=arc_teacher` with both fault switches: the grid module recovers through `train()`."""

from __future__ import annotations

import logging

import pytest
from tiny_runs import TINY_ARC_ON_CPU

from vramkit.core.run.train import train

TINY = ("task=arc_teacher", *TINY_ARC_ON_CPU)


@pytest.mark.slow
def test_arc_teacher_survives_injected_training_and_validation_ooms(compose_config, caplog):
    cfg = compose_config(
        *TINY,
        "debug=fdr",
        "callbacks=[default,oom_fault_injection]",
        "+fault.oom_train_above=2",
        "+fault.oom_val_above=1",
    )
    with caplog.at_level(logging.WARNING):
        cell_acc = train(cfg)
    assert 0.0 <= cell_acc <= 1.0
    assert "Fault injection on" in caplog.text
    assert "Out of memory in the train step" in caplog.text
    assert "Out of memory in the val step" in caplog.text
