"""Optimizer state layouts and batches grown from one sample."""

from __future__ import annotations

import math

import pytest
import torch

from vramkit.core.planner.cuda.optimizer_layouts import (
    AdamW8bitLayout,
    PagedAdamWLayout,
    ZeroStage2Layout,
    paged_state_bytes,
    state_tensors,
    use_cuda_defaults,
)
from vramkit.core.planner.tracing.batches import cast_floating, grow_batch
from vramkit.core.quantization.bitsandbytes_rules import bitsandbytes_rules_of
from vramkit.core.run.settling.plan_request_from_config import swap_bitsandbytes_optimizer


def state_bytes(optimizer: torch.optim.Optimizer) -> int:
    unique = {id(t): t for t in state_tensors(optimizer)}  # the shared quantization maps once
    return sum(t.numel() * t.element_size() for t in unique.values())


def stepped(optimizer: torch.optim.Optimizer, params: list[torch.nn.Parameter]) -> None:
    for param in params:
        param.grad = torch.zeros_like(param)
    optimizer.step()


@pytest.mark.parametrize(("version", "block"), [("0.50.2", 256), ("0.44.0", 256), ("0.43.3", 2048)])
def test_8bit_adamw_keeps_one_byte_per_moment_and_a_scale_per_block(version, block):
    big = torch.nn.Parameter(torch.zeros(10_000))
    small = torch.nn.Parameter(torch.zeros(100))  # under 4096 elements: 32-bit states
    with bitsandbytes_rules_of(version):
        optimizer = AdamW8bitLayout.like(torch.optim.AdamW([big, small], lr=0.1))
    stepped(optimizer, [big, small])
    blocks = math.ceil(10_000 / block)
    qmaps = 2 * 256 * 4  # "dynamic" and "udynamic", once
    assert state_bytes(optimizer) == 2 * 10_000 + 2 * blocks * 4 + 2 * 100 * 4 + qmaps
    assert optimizer.param_groups[0]["lr"] == 0.1


@pytest.mark.parametrize("bits", [8, 32])
def test_paged_adamw_keeps_large_moments_off_the_device(bits):
    """`get_state_buffer` pages tensors of >= 1e5 elements; the rest, and 8-bit scales, stay."""
    big = torch.nn.Parameter(torch.zeros(200_000))
    mid = torch.nn.Parameter(torch.zeros(10_000))  # 8-bit states, not paged
    small = torch.nn.Parameter(torch.zeros(100))
    params = [big, mid, small]
    optimizer = PagedAdamWLayout.like_paged(torch.optim.AdamW(params, lr=0.1), bits)
    stepped(optimizer, params)
    per_element = 1 if bits == 8 else 4
    assert optimizer.paged_bytes == 2 * 200_000 * per_element
    assert paged_state_bytes(params, bits) == optimizer.paged_bytes
    on_device = 2 * 10_000 * per_element + 2 * 100 * 4
    if bits == 8:
        on_device += 2 * 4 * (math.ceil(200_000 / 256) + math.ceil(10_000 / 256)) + 2 * 256 * 4
    assert state_bytes(optimizer) == on_device


def test_adamw_keeps_two_fp32_moments_and_uses_the_multi_tensor_step():
    param = torch.nn.Parameter(torch.zeros(1000))
    optimizer = torch.optim.AdamW([param])
    use_cuda_defaults(optimizer)
    assert optimizer.param_groups[0]["foreach"] is True
    stepped(optimizer, [param])
    assert state_bytes(optimizer) == 2 * 1000 * 4 + 4  # two moments and the step counter


def test_zero2_partitions_master_weights_and_moments_across_devices():
    param = torch.nn.Parameter(torch.zeros(1000, dtype=torch.float16))
    optimizer = ZeroStage2Layout(
        [param], world_size=4, offload=False, bucket_dtype=torch.float16, bucket_elements=64
    )
    param.grad = torch.zeros_like(param)
    optimizer.sink_gradient(param)
    assert param.grad is None
    assert sum(t.numel() for t in optimizer.device_gradients()) == 2 * 64 + 250
    optimizer.step()
    assert state_bytes(optimizer) == 3 * 250 * 4
    offloaded = ZeroStage2Layout(
        [param], world_size=1, offload=True, bucket_dtype=torch.float16, bucket_elements=64
    )
    param.grad = torch.zeros_like(param)
    offloaded.sink_gradient(param)
    offloaded.step()
    assert state_bytes(offloaded) == 0
    assert sum(t.numel() for t in offloaded.device_gradients()) == 2 * 64


def test_a_batch_grows_tensors_and_repeats_per_sample_annotations():
    sample = {
        "image": torch.zeros(1, 3, 8, 8),
        "ids": torch.zeros(1, 5, dtype=torch.long),
        "polygons": [[(0, 0), (1, 1)]],
        "pair": (torch.zeros(1, 2), torch.zeros(1)),
        "skipped": 0,
    }
    batch = cast_floating(grow_batch(sample, 4), torch.bfloat16)
    assert batch["image"].shape == (4, 3, 8, 8) and batch["image"].dtype == torch.bfloat16
    assert batch["ids"].dtype == torch.long and batch["ids"].shape == (4, 5)
    assert batch["polygons"] == [[(0, 0), (1, 1)]] * 4
    assert [t.shape for t in batch["pair"]] == [(4, 2), (4,)]
    assert batch["skipped"] == 0


@pytest.mark.parametrize(
    ("target", "layout"),
    [
        ("bitsandbytes.optim.AdamW8bit", "adamw_8bit"),
        ("bitsandbytes.optim.PagedAdamW8bit", "paged_adamw_8bit"),
        ("bitsandbytes.optim.PagedAdamW", "paged_adamw"),
        ("bitsandbytes.optim.PagedAdamW32bit", "paged_adamw_32bit"),
        ("torch.optim.AdamW", None),
    ],
)
def test_a_configured_bitsandbytes_optimizer_is_planned_with_its_own_layout(target, layout):
    """A paged optimizer is no longer planned as the unpaged 8-bit one (device memory)."""
    from omegaconf import OmegaConf

    cfg = OmegaConf.create({"optimizer": {"_target_": target, "lr": 0.1, "optim_bits": 8}})
    assert swap_bitsandbytes_optimizer(cfg) == layout
    if layout is not None:
        assert cfg.optimizer._target_ == "torch.optim.AdamW" and "optim_bits" not in cfg.optimizer
