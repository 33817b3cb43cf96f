"""Strategies are trainer configs: each composes, and the planner's remedy lines name them."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from vramkit.core.hardware.profile import ProfileSource, validate_profile
from vramkit.core.planner.tracing.sharding import DDP, FSDP, SINGLE, ZERO2, ZERO2_OFFLOAD, ZERO3
from vramkit.core.run.settling.compose import compose_config
from vramkit.core.run.settling.plan_request_from_config import profile_setup
from vramkit.core.run.settling.resolvers import register_resolvers

STRATEGIES = {
    "ddp": ("lightning.pytorch.strategies.DDPStrategy", True),
    "ddp_sim": ("ddp", True),
    "fsdp": ("lightning.pytorch.strategies.FSDPStrategy", True),
    "deepspeed_zero2": ("lightning.pytorch.strategies.DeepSpeedStrategy", None),
    "deepspeed_zero2_offload": ("lightning.pytorch.strategies.DeepSpeedStrategy", None),
    "deepspeed_zero3": ("lightning.pytorch.strategies.DeepSpeedStrategy", None),
}


def _compose(tmp_path, *overrides: str):
    # Reading a profile value previews the plan, which renders the task's data: under tmp_path.
    data = f"paths.data_dir={tmp_path / 'data'}"
    return compose_config("train", [data, *overrides], output_dir=tmp_path)


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_each_strategy_composes_with_its_settings(name, tmp_path):
    register_resolvers()
    cfg = _compose(tmp_path, "+hw=cpu", f"trainer={name}")
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


SHARDINGS = {
    "default": DDP,  # Lightning's "auto" on several devices
    "ddp": DDP,
    "ddp_sim": DDP,
    "fsdp": FSDP,
    "deepspeed_zero2": ZERO2,
    "deepspeed_zero2_offload": ZERO2_OFFLOAD,
    "deepspeed_zero3": ZERO3,
}


@pytest.mark.parametrize("name", sorted(SHARDINGS))
def test_the_planner_plans_each_strategy_per_device_of_its_world(name, tmp_path):
    register_resolvers()
    overrides = ["+hw=a100_40gb", f"trainer={name}", "hw.devices=4", "hw.num_nodes=2"]
    cfg = _compose(tmp_path, *overrides)
    profile = validate_profile(
        OmegaConf.to_container(cfg.hw), ProfileSource("conf/hw/a100_40gb.yaml")
    )
    sharding = profile_setup(cfg, profile).sharding
    assert sharding.strategy == SHARDINGS[name]
    # ddp_sim states its own 2 processes per node; the others run on 4 GPUs × 2 nodes.
    assert sharding.world_size == (2 * 2 if name == "ddp_sim" else 4 * 2)


def test_one_device_with_the_default_trainer_is_the_trace_itself(tmp_path):
    register_resolvers()
    cfg = _compose(tmp_path, "+hw=a100_40gb")
    profile = validate_profile(OmegaConf.to_container(cfg.hw), ProfileSource("a100_40gb"))
    assert profile_setup(cfg, profile).sharding.strategy == SINGLE


def test_num_nodes_flows_from_the_profile_to_the_trainer(tmp_path):
    register_resolvers()
    overrides = ["+hw=a100_40gb", "trainer=ddp", "hw.num_nodes=3", "hw.batch_size=8"]
    overrides.append("hw.val_batch_size=8")  # explicit sizes: the preview only checks them
    cfg = _compose(tmp_path, *overrides)
    assert cfg.trainer.num_nodes == 3
