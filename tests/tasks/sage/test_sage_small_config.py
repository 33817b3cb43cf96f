"""experiment=sage_small gives both steps of the chain the same recipe, and both modules take it."""

from __future__ import annotations

import pytest

from vramkit.core.config.instantiate import instantiate
from vramkit.core.run.settling.compose import settled_config
from vramkit.core.run.settling.settle import settle


@pytest.mark.parametrize(
    ("task", "width"), [("arc_teacher", 128), ("sage_distill", 64)], ids=["teacher", "student"]
)
def test_sage_small_recipe_reaches_each_module(compose_config, task, width):
    cfg = compose_config("experiment=sage_small", f"task={task}", "+hw=cpu")
    cfg = settled_config(settle(cfg, plan_batches=False))  # the module only, no data
    model = instantiate(cfg.model)
    assert model.changed_weight == 4.0  # changed cells weigh more in the cell loss
    assert model.net.copy_scale.item() == 4.0  # every model starts at copying the input
    assert model.net.width == width
