"""Planning CPU activation offloading: saved tensors leave the device during the forward pass."""

from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf
from planning_models import CONV_MODEL, IMAGE_DATA, task_config

from vramkit.core.hardware.profile import ProfileSource, validate_profile
from vramkit.core.planner import TRAIN, VAL, plan_task
from vramkit.core.planner.tracing.recorder import ACTIVATIONS, PARAMETERS
from vramkit.core.run.settling.plan_request_from_config import plan_request

CONF_DIR = Path(__file__).resolve().parents[4] / "conf"


def _t4_config(offload: bool):
    hw = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "hw" / "t4.yaml"))
    cfg = task_config(CONV_MODEL, IMAGE_DATA, hw)
    cfg.callbacks = {"activation_offload": {"enabled": offload}}
    return cfg, validate_profile(hw, ProfileSource("t4"))


def test_offloaded_saves_leave_the_device_and_validation_is_unchanged():
    cfg, profile = _t4_config(offload=False)
    plan = plan_task(plan_request(cfg, profile, batch_sizes=(64, 64), with_remedies=False))
    assert plan.setup.activation_offload is False
    offloaded = plan.setup.replace(activation_offload=True)
    train = plan.planner.measure(TRAIN, 64, offloaded)
    assert train.allocated[ACTIVATIONS] < 0.6 * plan.train.allocated[ACTIVATIONS]
    assert train.allocated[PARAMETERS] == plan.train.allocated[PARAMETERS]
    assert plan.planner.measure(VAL, 64, offloaded) == plan.val  # no grad: nothing saved


def test_the_plan_reads_the_offload_switch_from_the_callbacks_config():
    cfg, profile = _t4_config(offload=True)
    plan = plan_task(plan_request(cfg, profile, batch_sizes=(8, 8), with_remedies=False))
    assert plan.setup.activation_offload is True
