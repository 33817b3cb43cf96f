"""A `cpu` run's budget is the host's memory: a size that cannot fit is refused before any work
with the remedies, and the plan is close to the RSS a run measures (the tiny text classifier
traced and run). The decisions themselves are tested on stand-in planners in
tests/core/planner/decisions/test_host_sizing.py.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from vramkit.core.hardware.profile import ProfileError
from vramkit.core.planner.errors import DoesNotFitError
from vramkit.core.report.build import MEMORY_PLAN
from vramkit.core.run.train import train

TINY_TEXT = (
    "task=text_classification",
    "+hw=cpu",
    "hw.num_workers=0",
    "trainer.max_epochs=1",
    "logger=csv",
    "callbacks=default",
)


def test_a_cpu_run_over_the_hosts_memory_is_refused_before_any_work(compose_config):
    cfg = compose_config(*TINY_TEXT, "hw.batch_size=4", "hw.val_batch_size=4", "hw.memory_gib=0.2")
    with pytest.raises(DoesNotFitError) as refused:
        train(cfg)
    message = str(refused.value)
    assert "does not fit this host's memory" in message and "hw.memory_gib 0.2 GiB" in message
    assert "Remedies:" in message and "\n" not in message
    assert not Path(cfg.paths.output_dir).exists()  # refused before the run folder


def test_a_cpu_budget_above_the_hosts_memory_is_refused_before_any_work(compose_config):
    cfg = compose_config(*TINY_TEXT, "hw.memory_gib=5000")
    with pytest.raises(ProfileError, match=r"^hw\.memory_gib=5000 .* is more than this host's"):
        train(cfg)
    assert not Path(cfg.paths.output_dir).exists()


def test_the_planned_host_memory_is_close_to_the_measured_rss(compose_config):
    """The tiny classifier at batch 64 of 256 tokens: a step of about 0.3 GiB on the host."""
    cfg = compose_config(
        *TINY_TEXT,
        "hw.batch_size=64",
        "hw.val_batch_size=64",
        "data.max_length=256",
        "model.hf_config.max_position_embeddings=256",
    )
    train(cfg)
    run = Path(cfg.paths.output_dir)
    planned = json.loads((run / MEMORY_PLAN).read_text())
    (metrics,) = run.glob("**/metrics.csv")
    with metrics.open() as handle:
        rows = list(csv.DictReader(handle))
    for phase in ("train", "val"):
        measured = max(
            float(r[f"mem/{phase}_peak_gib"]) for r in rows if r[f"mem/{phase}_peak_gib"]
        )
        predicted = planned[phase]["peak_gib"]
        # stated tolerance: the plan is within -10% / +25% of the measured peak RSS
        assert 0.9 * measured <= predicted <= 1.25 * measured, (phase, predicted, measured)
