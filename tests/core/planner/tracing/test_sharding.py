"""Per-device plans: each strategy's share of the traced model states, by its cited formula."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from omegaconf import OmegaConf
from planning_models import CONV_MODEL, IMAGE_DATA, task_config
from torch import nn

from vramkit.core.hardware.profile import ProfileSource, validate_profile
from vramkit.core.planner import TRAIN, PlanningError, plan_json, plan_table, plan_task
from vramkit.core.planner.tracing.recorder import (
    ACTIVATIONS,
    GRADIENTS,
    INPUTS,
    OPTIMIZER_STATE,
    PARAMETERS,
)
from vramkit.core.planner.tracing.sharding import (
    DDP,
    FSDP,
    SINGLE,
    ZERO2,
    ZERO2_OFFLOAD,
    ZERO3,
    Sharding,
    ddp_bucket_bytes,
    model_states,
    shard_allocated,
    sharding_of,
)
from vramkit.core.run.settling.plan_request_from_config import plan_request

CONF_DIR = Path(__file__).resolve().parents[4] / "conf"
N = 4
BUCKET = 200_000_000  # Lightning's DeepSpeedStrategy reduce_bucket_size (elements)


class _Blocks(nn.Module):
    """Two big blocks (partitioned by ZeRO-3) and a small head (kept whole: < 1e5 elements)."""

    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(512, 512, bias=False)  # 262,144 elements
        self.second = nn.Linear(512, 256, bias=False)  # 131,072 elements
        self.head = nn.Linear(256, 10)  # 2,570 elements


def _round(nbytes: float) -> int:
    return math.ceil(nbytes / 512) * 512


@pytest.fixture(scope="module")
def traced():
    """One device's trace of full model states under 16-mixed AdamW: fp32 P = G = 4Ψ, S = 8Ψ."""
    model = _Blocks()
    psi = sum(p.numel() for p in model.parameters())
    allocated = {
        PARAMETERS: 4 * psi,
        GRADIENTS: 4 * psi,
        OPTIMIZER_STATE: 8 * psi,
        INPUTS: 1000,
        ACTIVATIONS: 5_000_000,
    }
    return model, psi, allocated


def _shard(traced, sharding: Sharding, *, backward: bool = True, wrap=()) -> dict[str, int]:
    model, _, allocated = traced
    states = model_states(model, wrap)
    return shard_allocated(allocated, states, sharding, "16-mixed", backward=backward)


def test_ddp_keeps_a_replica_and_adds_the_reducers_bucket_copies(traced):
    _, psi, allocated = traced
    result = _shard(traced, Sharding(DDP, N))
    # 4Ψ bytes of gradients: a first bucket of 1 MiB, the rest in 25 MiB buckets (one here).
    buckets = _round(2**20) + _round(4 * psi - 2**20)
    assert ddp_bucket_bytes(model_states(traced[0])) == buckets
    assert result[PARAMETERS] == 4 * psi
    assert result[GRADIENTS] == 4 * psi + buckets
    assert result[OPTIMIZER_STATE] == 8 * psi
    as_views = _shard(traced, Sharding(DDP, N, gradient_as_bucket_view=True))
    assert as_views[GRADIENTS] == max(4 * psi, buckets)
    assert result[ACTIVATIONS] == allocated[ACTIVATIONS] and result[INPUTS] == allocated[INPUTS]


def test_fsdp_full_shard_keeps_a_shard_and_gathers_the_largest_unit(traced):
    _, psi, _ = traced
    # No wrap policy (conf/trainer/fsdp.yaml): the root is the one unit, the whole model.
    result = _shard(traced, Sharding(FSDP, N))
    assert result[PARAMETERS] == _round(4 * psi / N + 2 * psi)  # shard fp32 + fp16 gathered
    assert result[GRADIENTS] == _round(4 * psi / N + 2 * psi)  # shard + fp16 unsharded unit
    assert result[OPTIMIZER_STATE] == _round(8 * psi / N)
    # Wrapping each Linear: two units gathered in backward (prefetch), one in forward.
    wrapped = _shard(traced, Sharding(FSDP, N, wrap_classes=("Linear",)), wrap=("Linear",))
    unit = 512 * 512
    pair = 512 * 512 + 512 * 256  # the two largest units
    assert wrapped[PARAMETERS] == _round(4 * psi / N + pair * 2)
    assert wrapped[GRADIENTS] == _round(4 * psi / N + unit * 2)
    validation = _shard(
        traced, Sharding(FSDP, N, wrap_classes=("Linear",)), backward=False, wrap=("Linear",)
    )
    assert validation[PARAMETERS] == _round(4 * psi / N + unit * 2)


def test_zero2_keeps_16_bit_weights_and_shards_gradients_and_optimizer_state(traced):
    _, psi, _ = traced
    result = _shard(traced, Sharding(ZERO2, N))
    # Rajbhandari et al. 2020: 2Ψ + (2 + K)Ψ/N with K = 12 (fp32 master, momentum, variance).
    assert result[PARAMETERS] == _round(2 * psi)
    assert result[GRADIENTS] == _round(2 * psi / N) + 2 * BUCKET * 2
    assert result[OPTIMIZER_STATE] == _round(12 * psi / N)
    offload = _shard(traced, Sharding(ZERO2_OFFLOAD, N))
    assert offload[OPTIMIZER_STATE] == 0
    assert offload[GRADIENTS] == 2 * BUCKET * 2
    assert offload[PARAMETERS] == result[PARAMETERS]


def test_zero3_shards_parameters_too_and_gathers_a_module_and_a_prefetch_bucket(traced):
    _, psi, _ = traced
    result = _shard(traced, Sharding(ZERO3, N))
    persistent = 256 * 10 + 10  # the head, under stage3_param_persistence_threshold
    partitioned = psi - persistent
    gathered = min(512 * 512 + 50_000_000, partitioned)  # largest module + prefetch bucket
    kept = 2 * persistent + math.ceil(2 * partitioned / N)
    assert result[PARAMETERS] == _round(kept + 2 * gathered)
    assert result[GRADIENTS] == _round(2 * psi / N) + BUCKET * 2
    assert result[OPTIMIZER_STATE] == _round(12 * psi / N)


def test_one_device_is_the_trace_itself(traced):
    assert _shard(traced, Sharding(SINGLE, 1)) == traced[2]


def test_trainer_configs_name_their_sharding():
    deepspeed = "lightning.pytorch.strategies.DeepSpeedStrategy"
    assert sharding_of({}, 1).strategy == SINGLE
    assert sharding_of({"strategy": "auto"}, 4).strategy == DDP  # Lightning's choice
    assert sharding_of({"strategy": {"_target_": deepspeed, "stage": 3}}, 4).strategy == ZERO3
    offload = {"_target_": deepspeed, "stage": 2, "offload_optimizer": True}
    assert sharding_of({"strategy": offload}, 2) == Sharding(ZERO2_OFFLOAD, 2)
    with pytest.raises(PlanningError, match="stages 2 and 3"):
        sharding_of({"strategy": {"_target_": deepspeed, "stage": 1}}, 2)
    hybrid = {"_target_": "lightning.pytorch.strategies.FSDPStrategy"}
    hybrid["sharding_strategy"] = "HYBRID_SHARD"
    with pytest.raises(PlanningError, match="not 'HYBRID_SHARD'"):
        sharding_of({"strategy": hybrid}, 8)


def _plan(trainer: dict, devices: int):
    hw = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "hw" / "t4.yaml"))
    hw["devices"] = devices
    cfg = task_config(CONV_MODEL, IMAGE_DATA, hw)
    cfg.trainer.update(trainer)
    return plan_task(
        plan_request(cfg, validate_profile(hw, ProfileSource("t4")), batch_sizes=(8, 8))
    )


def test_a_plan_on_four_gpus_with_zero2_holds_less_optimizer_state_than_ddp():
    ddp = _plan({"strategy": "ddp"}, N)
    zero2 = _plan(
        {"strategy": {"_target_": "lightning.pytorch.strategies.DeepSpeedStrategy", "stage": 2}}, N
    )
    single = _plan({}, 1)
    for phase in ("train", "val"):
        assert (
            getattr(zero2, phase).allocated[OPTIMIZER_STATE]
            < (getattr(ddp, phase).allocated[OPTIMIZER_STATE])
        )
        # Activations are each device's own batch: DDP's are one device's; DeepSpeed runs the
        # 16-bit model without autocast (traced as 16-true), so it needs no weight-cast cache.
        assert (
            getattr(ddp, phase).allocated[ACTIVATIONS]
            == (getattr(single, phase).allocated[ACTIVATIONS])
        )
        assert (
            getattr(zero2, phase).allocated[ACTIVATIONS]
            <= (getattr(single, phase).allocated[ACTIVATIONS])
        )
    assert ddp.train.allocated[GRADIENTS] > single.train.allocated[GRADIENTS]  # bucket copies
    table = plan_table(zero2)
    assert "per device (4 GPUs, DeepSpeed ZeRO-2)" in table
    assert "optimizer state (1/4, fp32 + master)" in table
    data = plan_json(zero2)
    assert (data["strategy"], data["world_size"], data["per_device"]) == (ZERO2, N, True)
    assert "per device" not in plan_table(single)
    assert plan_json(single)["strategy"] == SINGLE


def test_the_zero2_remedy_of_a_four_gpu_run_is_planned_per_device():
    hw = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "hw" / "t4.yaml"))
    hw.update(devices=N, memory_gib=0.5)  # nothing fits: every remedy is listed
    cfg = task_config(CONV_MODEL, IMAGE_DATA, hw)
    cfg.trainer.update({"strategy": "ddp"})
    profile = validate_profile(hw, ProfileSource("t4"))
    plan = plan_task(plan_request(cfg, profile, batch_sizes=(8, 8)))
    by_name = {remedy.name: remedy for remedy in plan.remedies}
    zero2 = by_name[f"DeepSpeed ZeRO-2 across {N} GPUs"]
    assert zero2.overrides[0] == "trainer=deepspeed_zero2"
    # One device's trace with fp16 weights: each tensor rounded to 512 B as the allocator does.
    one = plan.planner.measure(
        TRAIN, 8, plan.setup.replace(sharding=Sharding(), precision="16-true")
    ).allocated
    params = list(plan.planner._subject(plan.setup).module.parameters())
    psi = sum(p.numel() for p in params)
    # fp16 weights (2Ψ) whole; Adam's moments in fp32 (2 × the fp16 trace's) + the fp32
    # master weights (4Ψ) over the 4 devices: 12Ψ/N.
    assert zero2.train.allocated[PARAMETERS] == one[PARAMETERS]
    assert zero2.train.allocated[OPTIMIZER_STATE] == _round(
        (2 * one[OPTIMIZER_STATE] + 4 * psi) / N
    )
    # fp16 moments: 4Ψ, plus each parameter's state tensors rounded up to 512-B blocks.
    assert 4 * psi <= one[OPTIMIZER_STATE] <= 4 * psi + 3 * 512 * len(params)
    assert zero2.train.allocated[OPTIMIZER_STATE] < plan.train.allocated[OPTIMIZER_STATE]
    offload = by_name["DeepSpeed ZeRO-2, CPU offload"]
    assert offload.train.allocated[OPTIMIZER_STATE] == 0


@pytest.mark.parametrize(
    ("strategy", "phases"),
    [("ddp", ("train", "val")), ("fsdp", ("val",))],
)
def test_the_cudnn_workspace_figure_is_per_device_as_the_peak_is(strategy, phases):
    # The convolutions' workspaces rise above the traced peak; the model states live at that
    # moment are sharded as the peak's are, the workspace (each device's own call) is not. In
    # validation the model states are the same at every moment, and DDP's bucket copies exist
    # at both moments of a training step: the figure moves exactly as the allocated peak does.
    single = _plan({}, 1)
    sharded = _plan({"strategy": strategy}, N)
    for phase in phases:
        one, per_device = getattr(single, phase), getattr(sharded, phase)
        assert one.allocated_with_workspaces > one.allocated_peak
        assert per_device.allocated_peak != one.allocated_peak
        assert (
            per_device.max_allocated_estimate - one.max_allocated_estimate
            == per_device.allocated_peak - one.allocated_peak
        )
