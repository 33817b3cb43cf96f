"""Warm-up by steps or by a fraction of the run, then poly, cosine or constant, as configured."""

import math

import pytest
import torch

from vramkit.core.config.schema import ConfigError
from vramkit.core.optim.lr_schedules import WarmupDecaySchedule


def _rates(schedule: WarmupDecaySchedule, total_steps: int) -> list[float]:
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    scheduler = schedule.build(optimizer, total_steps)
    rates = []
    for _ in range(total_steps):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return rates


def test_a_warmup_fraction_is_that_share_of_the_run():
    rates = _rates(WarmupDecaySchedule(warmup_fraction=0.1, decay="constant"), 200)
    assert rates[:20] == pytest.approx([(i + 1) / 20 for i in range(20)])
    assert rates[20:] == [1.0] * 180


@pytest.mark.parametrize(
    ("decay", "at_half"),
    [("poly", 0.5**0.9), ("cosine", 0.5), ("constant", 1.0)],
)
def test_each_decay_has_its_shape_after_the_warmup(decay, at_half):
    rates = _rates(WarmupDecaySchedule(warmup_steps=10, decay=decay), 110)
    assert rates[9] == 1.0
    assert rates[60] == pytest.approx(at_half)  # halfway through the 100 decay steps
    if decay != "constant":
        assert rates[-1] < 0.02


def test_cosine_follows_the_half_cosine():
    schedule = WarmupDecaySchedule(warmup_steps=0, decay="cosine")
    assert [schedule.factor(step, 100) for step in (0, 25, 75)] == pytest.approx(
        [1.0, 0.5 * (1 + math.cos(math.pi / 4)), 0.5 * (1 + math.cos(3 * math.pi / 4))]
    )


def test_a_misspelt_key_or_decay_is_refused_with_the_closest_valid_one():
    with pytest.raises(ConfigError, match="warmup_fraction") as refused:
        WarmupDecaySchedule.from_config({"warmup_fracton": 0.05}, key_prefix="model.lr_schedule.")
    assert "model.lr_schedule.warmup_fracton" in str(refused.value)
    with pytest.raises(ConfigError, match="cosine"):
        WarmupDecaySchedule.from_config({"decay": "cosin"}, key_prefix="model.lr_schedule.")
    with pytest.raises(ConfigError, match="warmup_fraction"):
        WarmupDecaySchedule.from_config({"warmup_fraction": 1.5}, key_prefix="model.lr_schedule.")
