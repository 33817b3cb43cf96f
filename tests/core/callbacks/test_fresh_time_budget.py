"""A run that max_time stopped resumes with max_time of its own, not stopping at once."""

from __future__ import annotations

import time

import lightning as L
import pytest
from resumable_fit import fit

from vramkit.core.callbacks.fresh_time_budget import FreshTimeBudget


class SlowSteps(L.Callback):
    """Makes every training step take ``seconds`` longer."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def on_train_batch_end(self, *args) -> None:
        time.sleep(self.seconds)


@pytest.mark.parametrize("fresh", [True, False])
def test_a_resumed_run_gets_the_whole_max_time_again(fresh, tmp_path):
    limit = {"seconds": 1}
    first, _ = fit(tmp_path, epochs=100, callbacks=[SlowSteps(0.1)], max_time=limit)
    stopped_at = first.global_step
    assert 0 < stopped_at < 100 * 6, "max_time must have stopped the first run"
    callbacks = [SlowSteps(0.1)] + ([FreshTimeBudget()] if fresh else [])
    resumed, _ = fit(
        tmp_path / "resumed",
        epochs=100,
        callbacks=callbacks,
        max_time=limit,
        ckpt_path=tmp_path / "last.ckpt",
    )
    if fresh:
        assert resumed.global_step >= stopped_at + 3, "the resumed run trained on"
    else:
        assert resumed.global_step == stopped_at, "Lightning's Timer: the budget was spent"
