"""`plan_inference_batch_size`: eval.py's batch from the inference phase alone, no training traces;
and its hook in `settle_profile(plan_inference=True)`, which `evaluate(cfg)` calls."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf
from planning_models import CONV_MODEL, IMAGE_DATA, task_config

from vramkit.core.hardware.detect import DeviceInfo
from vramkit.core.hardware.profile import ProfileSource, validate_profile
from vramkit.core.planner import DoesNotFitError, MemoryPlanner, plan_task
from vramkit.core.planner.decisions.inference_plan import plan_inference_batch_size
from vramkit.core.planner.decisions.plan import INFERENCE
from vramkit.core.planner.tracing.recorder import GRADIENTS, OPTIMIZER_STATE
from vramkit.core.run.settling.plan_request_from_config import plan_request
from vramkit.core.run.settling.resolve_hardware import settle_profile

CONF_DIR = Path(__file__).resolve().parents[4] / "conf"
SMALL_T4_GIB = 1.0  # a T4 profile shrunk so a tiny model's inference batch meets the budget
T4 = DeviceInfo("cuda", "Tesla T4", 14.57, (7, 5), count=1, cpu_count=2)
CPU = DeviceInfo("cpu", "CPU", 16.0, None, count=0, cpu_count=2)
DEFAULTS = (16, 24)  # batch_size_defaults: train, val


def _values(name: str, **changes) -> dict:
    values = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "hw" / f"{name}.yaml"))
    return {**values, **changes}


def _profile(name: str, **changes):
    return validate_profile(_values(name, **changes), ProfileSource(f"conf/hw/{name}.yaml"))


@pytest.fixture
def small_t4():
    hw = _values("t4", memory_gib=SMALL_T4_GIB)
    return task_config(CONV_MODEL, IMAGE_DATA, hw), _profile("t4", memory_gib=SMALL_T4_GIB)


@pytest.fixture
def measured_phases(monkeypatch) -> list[str]:
    """The phases every `MemoryPlanner.measure` call of the test asks for."""
    phases: list[str] = []
    measure = MemoryPlanner.measure

    def recording(self, phase, batch_size, setup):
        phases.append(phase)
        return measure(self, phase, batch_size, setup)

    monkeypatch.setattr(MemoryPlanner, "measure", recording)
    return phases


def test_auto_takes_the_full_plans_inference_batch_without_training_traces(
    small_t4, measured_phases
):
    cfg, profile = small_t4
    plan = plan_inference_batch_size(plan_request(cfg, profile, batch_sizes=(1, None)))
    assert set(measured_phases) == {INFERENCE}
    assert plan.fits and plan.requested is None and plan.largest == plan.inference.batch_size
    assert plan.inference.allocated[GRADIENTS] == plan.inference.allocated[OPTIMIZER_STATE] == 0
    full = plan_task(plan_request(cfg, profile, batch_sizes=(None, None), with_remedies=False))
    assert plan.inference.batch_size == full.inference.batch_size > 1
    assert plan.inference.peak == full.inference.peak
    one_more = full.planner.measure(INFERENCE, plan.inference.batch_size + 1, full.setup)
    assert one_more.peak > plan.budget_bytes  # the largest: the budget binds, not the data
    assert plan.traces < full.traces
    assert f"eval batch {plan.inference.batch_size} (the largest that fits)" in plan.line()
    assert f"of budget {SMALL_T4_GIB * profile.memory_budget_fraction:.2f} GiB" in plan.line()


def test_a_set_batch_that_fits_is_traced_once_and_kept(small_t4):
    cfg, profile = small_t4
    plan = plan_inference_batch_size(plan_request(cfg, profile, batch_sizes=(1, 8)))
    assert (plan.inference.batch_size, plan.traces, plan.largest) == (8, 1, None)
    assert plan.fits and "eval batch 8 (as set)" in plan.line()


def test_a_set_batch_over_the_budget_finds_the_largest_that_fits(small_t4):
    cfg, profile = small_t4
    largest = plan_inference_batch_size(
        plan_request(cfg, profile, batch_sizes=(1, None))
    ).inference.batch_size
    plan = plan_inference_batch_size(plan_request(cfg, profile, batch_sizes=(1, 4 * largest)))
    assert not plan.fits and plan.inference.batch_size == 4 * largest
    assert plan.largest == largest


def test_a_validation_set_that_fits_whole_settles_in_one_trace(small_t4):
    cfg, profile = small_t4
    cfg.data.val_length = 12
    plan = plan_inference_batch_size(plan_request(cfg, profile, batch_sizes=(1, None)))
    assert (plan.inference.batch_size, plan.traces) == (12, 1)
    assert "eval batch 12 (all 12 samples)" in plan.line()


def test_a_set_batch_larger_than_the_validation_set_is_planned_at_the_sets_size(small_t4):
    cfg, profile = small_t4
    cfg.data.val_length = 12
    plan = plan_inference_batch_size(plan_request(cfg, profile, batch_sizes=(1, 10_000)))
    assert (plan.inference.batch_size, plan.requested, plan.traces) == (12, 10_000, 1)
    assert plan.fits and "eval batch 10000 (as set; a batch holds all 12 samples)" in plan.line()


def test_a_profile_without_a_budget_plans_nothing(small_t4):
    cfg, _ = small_t4
    with pytest.raises(ValueError, match="no memory budget"):
        plan_inference_batch_size(plan_request(cfg, _profile("cpu"), batch_sizes=(1, None)))


@pytest.fixture
def eval_config():
    """A T4 eval config of the tiny model, outside any Hydra run."""
    saved = HydraConfig.instance().cfg
    HydraConfig.instance().cfg = None

    def config(**hw):
        return task_config(
            CONV_MODEL, IMAGE_DATA, _values("t4", memory_gib=SMALL_T4_GIB, **hw), DEFAULTS
        )

    yield config
    HydraConfig.instance().cfg = saved


def _eval_settled(cfg, device=T4):
    return settle_profile(
        cfg, conf_dir=CONF_DIR, device=device, plan_batches=False, plan_inference=True
    )


def _eval_profile(cfg, device=T4):
    return _eval_settled(cfg, device).profile


def test_eval_auto_takes_the_inference_plans_batch_in_one_line(eval_config):
    cfg = eval_config()
    settled = _eval_settled(cfg)
    profile = settled.profile
    largest = plan_inference_batch_size(
        plan_request(cfg, profile, batch_sizes=(1, None))
    ).inference.batch_size
    cfg.hw = profile.model_dump()  # what the run's composition gives its hw node
    assert profile.val_batch_size == cfg.data.val_batch_size == largest > DEFAULTS[1]
    assert profile.batch_size == DEFAULTS[0]  # evaluation never trains: no training plan
    (line,) = [line for line in settled.lines if "inference plan" in line]
    assert line.startswith(f"inference plan (t4, 16-mixed): eval batch {largest} (the largest")
    assert "planned peak" in line and "budget 0.85 GiB" in line
    assert not any("memory planner (" in line for line in settled.lines)


def test_eval_keeps_a_set_batch_that_fits(eval_config):
    settled = _eval_settled(eval_config(val_batch_size=8))
    assert settled.profile.val_batch_size == 8
    assert any("eval batch 8 (as set)" in line for line in settled.lines)


def test_eval_refuses_a_set_batch_over_the_budget_naming_the_key_and_the_largest(eval_config):
    largest = _eval_profile(eval_config()).val_batch_size
    with pytest.raises(DoesNotFitError) as refused:
        _eval_profile(eval_config(val_batch_size=4 * largest))
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith(f"hw.val_batch_size={4 * largest} (conf/hw/t4.yaml) does not fit")
    assert message.endswith(f"the largest that fits is {largest}: set hw.val_batch_size={largest}")


def test_eval_on_a_cpu_plans_nothing(eval_config):
    cfg = eval_config()
    del cfg["hw"]
    settled = _eval_settled(cfg, device=CPU)
    assert settled.profile.val_batch_size == DEFAULTS[1]
    assert not any("inference plan" in line for line in settled.lines)
