"""Strategies are trainer configs: each composes, and the planner's remedy lines name them."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from vramkit.core.run.compose import compose_config
from vramkit.core.run.resolvers import register_resolvers

STRATEGIES = {
    "ddp": ("ddp", True),
    "ddp_sim": ("ddp", True),
    "fsdp": ("lightning.pytorch.strategies.FSDPStrategy", True),
    "deepspeed_zero2": ("lightning.pytorch.strategies.DeepSpeedStrategy", None),
    "deepspeed_zero2_offload": ("lightning.pytorch.strategies.DeepSpeedStrategy", None),
    "deepspeed_zero3": ("lightning.pytorch.strategies.DeepSpeedStrategy", None),
}


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_each_strategy_composes_with_its_settings(name, tmp_path):
    register_resolvers()
    cfg = compose_config("train", ["+hw=cpu", f"trainer={name}"], output_dir=tmp_path)
    trainer = OmegaConf.to_container(cfg.trainer, resolve=True)
    strategy, sync = STRATEGIES[name]
    target = trainer["strategy"]
    assert (target if isinstance(target, str) else target["_target_"]) == strategy
    assert trainer["num_nodes"] == 1
    if sync is not None:
        assert trainer["sync_batchnorm"] is sync
    if name.startswith("deepspeed"):
        assert trainer["plugins"] is None  # DeepSpeed writes its own checkpoint folders
        stage = trainer["strategy"]["stage"]
        assert stage == (3 if name.endswith("zero3") else 2)
        assert trainer["strategy"]["offload_optimizer"] is name.endswith("offload")
    else:
        assert trainer["plugins"], "every other strategy keeps the atomic checkpoint writes"
    if name == "ddp_sim":
        assert trainer["accelerator"] == "cpu" and trainer["devices"] == 2
