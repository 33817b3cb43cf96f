"""`batch_size: auto` on a GPU profile: the planner's largest sizes, through settle_profile."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf
from planning_models import CONV_MODEL, IMAGE_DATA, task_config

from vramkit.core.hardware.detect import DeviceInfo
from vramkit.core.hardware.profile import ProfileSource, validate_profile
from vramkit.core.planner import TRAIN, VAL, plan_task, resolve_auto_batch_sizes
from vramkit.core.run.settling.plan_request_from_config import plan_request
from vramkit.core.run.settling.resolve_hardware import settle_profile

CONF_DIR = Path(__file__).resolve().parents[4] / "conf"
T4 = DeviceInfo("cuda", "Tesla T4", 14.57, (7, 5), count=1, cpu_count=2)
CPU = DeviceInfo("cpu", "CPU", 16.0, None, count=0, cpu_count=2)
SMALL_T4_GIB = 1.0  # a T4 profile shrunk so a tiny model's batch sizes meet the budget


def t4_values(**changes) -> dict:
    values = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "hw" / "t4.yaml"))
    return {**values, **changes}


@pytest.fixture(autouse=True)
def hw_lines(caplog: pytest.LogCaptureFixture) -> None:
    """The `hw:` decision lines are INFO records of vramkit's loggers."""
    caplog.set_level(logging.INFO, logger="vramkit")


@pytest.fixture(autouse=True)
def outside_hydra():
    saved = HydraConfig.instance().cfg
    HydraConfig.instance().cfg = None
    yield
    HydraConfig.instance().cfg = saved


@pytest.fixture(scope="module")
def small_t4_plan():
    hw = t4_values(memory_gib=SMALL_T4_GIB)
    profile = validate_profile(hw, ProfileSource("conf/hw/t4.yaml"))
    cfg = task_config(CONV_MODEL, IMAGE_DATA, hw, defaults=(4096, 64))
    return cfg, profile, plan_task(plan_request(cfg, profile, batch_sizes=(None, None)))


def test_auto_sizes_are_the_largest_under_the_budget(small_t4_plan):
    _, _, plan = small_t4_plan
    budget = plan.budget_bytes
    for phase, chosen in ((TRAIN, plan.train), (VAL, plan.val)):
        assert chosen.peak <= budget
        one_more = plan.planner.measure(phase, chosen.batch_size + 1, plan.setup)
        assert one_more.peak > budget
    # Validation keeps no activations for a backward pass: it takes a larger batch.
    assert plan.val.batch_size > plan.train.batch_size


def test_a_micro_batch_with_accumulation_keeps_the_effective_batch(small_t4_plan, caplog):
    cfg, profile, plan = small_t4_plan
    sizes = resolve_auto_batch_sizes(plan_request(cfg, profile))
    train, val, accumulate, lines = sizes.train, sizes.val, sizes.accumulate, sizes.lines
    assert train <= plan.train.batch_size
    assert train * accumulate == 4096  # batch_size_defaults.train
    assert val == plan.val.batch_size
    assert any(f"accumulate {accumulate} keeps the effective batch 4096" in line for line in lines)
    accumulating = plan.setup.replace(accumulate_grad_batches=accumulate)
    assert plan.planner.measure(TRAIN, train, accumulating).peak <= plan.budget_bytes


def test_a_global_target_batch_is_shared_by_every_process(small_t4_plan):
    cfg, _, _ = small_t4_plan
    four = validate_profile(
        t4_values(memory_gib=SMALL_T4_GIB, devices=2, num_nodes=2, target_effective_batch=4096),
        ProfileSource("conf/hw/t4.yaml"),
    )
    sizes = resolve_auto_batch_sizes(plan_request(cfg, four))  # planned per device (DDP)
    train, accumulate, lines = sizes.train, sizes.accumulate, sizes.lines
    assert train * accumulate == 1024  # per device: 4096 over 2 devices × 2 nodes
    assert any("(hw.target_effective_batch / 4 processes)" in line for line in lines)


def test_settling_hands_the_planned_sizes_to_the_trainer_and_data():
    cfg = task_config(CONV_MODEL, IMAGE_DATA, t4_values(memory_gib=SMALL_T4_GIB), (16, 16))
    cfg.trainer.accumulate_grad_batches = "${hw.accumulate_grad_batches}"
    settled = settle_profile(cfg, conf_dir=CONF_DIR, device=T4)
    profile = settled.profile
    cfg.hw = profile.model_dump()  # what the run's composition gives its hw node
    out = "\n".join(settled.lines)
    assert "memory planner (t4, 16-mixed" in out
    assert isinstance(profile.batch_size, int) and profile.batch_size > 16
    assert cfg.data.batch_size == profile.batch_size  # what the datamodule and Trainer receive
    assert cfg.data.val_batch_size == profile.val_batch_size
    assert cfg.trainer.accumulate_grad_batches == 1


def test_on_a_cpu_auto_keeps_the_task_defaults():
    cfg = task_config(CONV_MODEL, IMAGE_DATA, {}, (12, 20))
    del cfg["hw"]
    settled = settle_profile(cfg, conf_dir=CONF_DIR, device=CPU)
    assert (settled.profile.batch_size, settled.profile.val_batch_size) == (12, 20)
    assert not any("memory planner" in line for line in settled.lines)


def test_a_planned_run_hands_back_the_prediction_for_its_report(tmp_path):
    cfg = task_config(CONV_MODEL, IMAGE_DATA, t4_values(memory_gib=SMALL_T4_GIB), (16, 16))
    cfg.paths = {"output_dir": str(tmp_path)}
    settled = settle_profile(cfg, conf_dir=CONF_DIR, device=T4)
    profile = settled.profile
    assert not (tmp_path / "memory_plan.json").exists()  # deciding writes nothing; the run does
    written = settled.memory_plan
    assert written["profile"] == "t4"
    assert written["train"]["batch_size"] == profile.batch_size
    assert written["val"]["batch_size"] == profile.val_batch_size
    for phase in ("train", "val"):
        assert 0 < written[phase]["max_allocated_gib"] < written[phase]["peak_gib"]
        # The convolutions' workspaces at their estimate, within the budgeted peak.
        estimate = written[phase]["max_allocated_estimate_gib"]
        assert written[phase]["max_allocated_gib"] < estimate < written[phase]["peak_gib"]
        assert written[phase]["peak_gib"] <= written["budget_gib"]
