"""The plan says what its cuDNN-workspace figure is: an estimate with a measured band."""

from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf
from planning_models import CONV_MODEL, IMAGE_DATA, task_config

from vramkit.core.hardware.profile import ProfileSource, validate_profile
from vramkit.core.planner import plan_json, plan_table, plan_task
from vramkit.core.planner.cuda.op_rules import CUDNN_ESTIMATE_BAND
from vramkit.core.run.settling.plan_request_from_config import plan_request
from vramkit.core.units import GIB

CONF_DIR = Path(__file__).resolve().parents[4] / "conf"


def test_the_plan_calls_the_workspace_figure_an_estimate_and_budgets_it():
    hw = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "hw" / "t4.yaml"))
    cfg = task_config(CONV_MODEL, IMAGE_DATA, hw)
    plan = plan_task(
        plan_request(cfg, validate_profile(hw, ProfileSource("t4")), batch_sizes=(8, 8))
    )
    data, table = plan_json(plan), plan_table(plan)
    for name in ("train", "val"):
        phase = getattr(plan, name)
        assert phase.allocated_with_workspaces > phase.allocated_peak  # the 3x3 lowerings rise
        assert data[name]["max_allocated_estimate_gib"] == round(
            phase.max_allocated_estimate / GIB, 3
        )
        assert "max_allocated_bound_gib" not in data[name]
        assert phase.peak >= phase.cuda_context + phase.max_allocated_estimate
    low, high = CUDNN_ESTIMATE_BAND
    assert "cuDNN workspace about" in table and "at most" not in table
    assert f"measured {low:.2f}x to {high:.2f}x" in table
