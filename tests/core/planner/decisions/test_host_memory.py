"""The host plan's parts (workers, batches in flight, pinning, DeepSpeed offload) and the host's
budget as /proc, a cgroup and an address-space limit state it."""

from __future__ import annotations

import contextlib
import dataclasses
import resource

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode

from vramkit.core.hardware import memory_stats
from vramkit.core.hardware.memory_stats import HostRoom, read_host_room
from vramkit.core.planner.decisions.host_memory import (
    WORKER_BASELINE_BYTES,
    LoaderMemory,
    batch_bytes,
    dataset_bytes,
    host_budget,
    offloaded_bytes,
    plan_host_phase,
)
from vramkit.core.units import GIB

MIB = 2**20


def test_workers_and_batches_in_flight_are_counted_per_worker():
    loader = LoaderMemory(batch_bytes=10 * MIB, dataset_bytes=100 * MIB, num_workers=3)
    other = LoaderMemory(batch_bytes=4 * MIB, dataset_bytes=50 * MIB, num_workers=3)
    plan = plan_host_phase(
        "train", 8, baseline=GIB, step=2 * GIB, loader=loader, idle_loaders=(other,)
    )
    assert plan.batches == 3 * 2 * 10 * MIB  # num_workers × prefetch_factor finished batches
    own = 3 * (WORKER_BASELINE_BYTES + 100 * MIB + 10 * MIB)
    idle = 3 * (WORKER_BASELINE_BYTES + 50 * MIB + 4 * MIB)  # persistent: alive meanwhile
    assert plan.workers == own + idle
    assert plan.pinned == 0  # no GPU
    assert plan.total == GIB + 2 * GIB + plan.batches + plan.workers
    assert plan.main_process == GIB + 2 * GIB + plan.batches


def test_pinned_copies_round_to_a_power_of_two_on_a_gpu_only():
    loader = LoaderMemory(batch_bytes=5 * MIB, dataset_bytes=0, num_workers=2, pin_memory=True)
    gpu = plan_host_phase("train", 4, baseline=0, step=0, loader=loader, gpu=True)
    assert gpu.pinned == 4 * 8 * MIB  # 2 workers × 2 prefetched, each block 5 → 8 MiB
    cpu = plan_host_phase("train", 4, baseline=0, step=0, loader=loader, gpu=False)
    assert cpu.pinned == 0


def test_two_processes_on_one_host_count_twice():
    loader = LoaderMemory(batch_bytes=MIB, dataset_bytes=0)
    one = plan_host_phase("train", 1, baseline=GIB, step=GIB, loader=loader)
    assert dataclasses.replace(one, processes=2).total == 2 * one.total


def test_deepspeed_offload_follows_deepspeeds_estimators():
    # estimate_zero2_model_states_mem_needs(cpu_offload=True): params × max(4 × gpus, 16) × 1.5
    assert offloaded_bytes("deepspeed_zero2_offload", 10**9, 1) == 24 * 10**9
    assert offloaded_bytes("deepspeed_zero2_offload", 10**9, 8) == 48 * 10**9
    assert offloaded_bytes("deepspeed_zero3_offload", 10**9, 1) == 27 * 10**9
    assert offloaded_bytes("deepspeed_zero2", 10**9, 1) == 0


def test_batch_and_dataset_sizes():
    sample = {"x": torch.zeros(1, 3, 8, 8), "y": [torch.zeros(1, dtype=torch.long)], "name": ["a"]}
    assert batch_bytes(sample, 4) == 4 * (3 * 8 * 8 * 4 + 8)
    assert dataset_bytes(list(range(10_000))) > 10_000
    assert dataset_bytes(lambda: None) is None  # unknown, not an error


def _proc(tmp_path, available_kib: int, rss_kib: int, size_kib: int = 0):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text(f"MemTotal: 99999999 kB\nMemAvailable: {available_kib} kB\n")
    status = tmp_path / "status"
    status.write_text(f"VmSize: {size_kib} kB\nVmRSS: {rss_kib} kB\n")
    return meminfo, status


def test_the_room_is_memavailable_or_a_smaller_cgroup_limit(tmp_path):
    meminfo, status = _proc(tmp_path, available_kib=8 * 2**20, rss_kib=2**20)
    limit, usage = tmp_path / "memory.max", tmp_path / "memory.current"
    limit.write_text("max\n")  # cgroup v2: no limit
    usage.write_text(f"{GIB}\n")
    room = read_host_room(meminfo, status, ((limit, usage),))
    assert (room.room, room.own, room.total) == (8 * GIB, GIB, 9 * GIB)
    assert room.source.startswith("MemAvailable")
    limit.write_text(f"{4 * GIB}\n")
    room = read_host_room(meminfo, status, ((limit, usage),))
    assert room.room == 3 * GIB and room.source.startswith("cgroup limit")
    assert read_host_room(tmp_path / "missing", status, ()) is None


def test_an_address_space_limit_caps_the_room(tmp_path, monkeypatch):
    meminfo, status = _proc(tmp_path, available_kib=8 * 2**20, rss_kib=2**20, size_kib=3 * 2**20)
    monkeypatch.setattr(
        memory_stats.resource, "getrlimit", lambda kind: (5 * GIB, resource.RLIM_INFINITY)
    )
    room = read_host_room(meminfo, status, ())
    assert room.room == 2 * GIB  # 5 GiB of address space, 3 mapped
    assert "ulimit -v" in room.source


def test_a_stated_memory_replaces_the_reading():
    room = HostRoom(room=10 * GIB, own=GIB, source="MemAvailable 10.00 GiB")
    budget = host_budget(0.5, memory_gib=4, room=room)
    assert budget.budget == 2 * GIB
    assert budget.capped_from is None
    assert "hw.memory_gib 4 GiB" in budget.describe()


def test_a_stated_memory_above_what_the_host_has_now_is_capped_there():
    # A single planned step larger than the machine must be refused by the plan: the stated
    # budget cannot lift the plan above the memory this process can have.
    room = HostRoom(room=10 * GIB, own=GIB, source="MemAvailable 10.00 GiB")
    budget = host_budget(0.5, memory_gib=20, room=room)
    assert (budget.available, budget.capped_from) == (11 * GIB, 20)
    assert "hw.memory_gib 20 GiB capped to MemAvailable 10.00 GiB + this process 1.00 GiB" in (
        budget.describe()
    )


@pytest.mark.skipif(read_host_room() is None, reason="needs /proc (Linux)")
def test_this_hosts_budget_includes_this_process():
    budget = host_budget(0.85)
    assert budget.available > memory_stats.read_host_memory().current


class _AttentionMatrices(TorchDispatchMode):
    """Records the [B, H, T, S] outputs of the ops it sees, on fake tensors as on real ones."""

    def __init__(self, shape: tuple[int, ...]) -> None:
        super().__init__()
        self.shape = shape
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        outputs = out if isinstance(out, (tuple, list)) else (out,)
        if any(isinstance(t, torch.Tensor) and tuple(t.shape) == self.shape for t in outputs):
            self.ops.append(func.__name__)
        return out


def _attention_matrices(*, fake: bool, mask: bool, dropout: float) -> list[str]:
    batch, heads, length, head_dim = 2, 4, 16, 8
    with FakeTensorMode() if fake else contextlib.nullcontext():
        query, key, value = (
            torch.randn(batch, heads, length, head_dim, requires_grad=True) for _ in range(3)
        )
        attn_mask = torch.ones(batch, 1, length, length, dtype=torch.bool) if mask else None
        with _AttentionMatrices((batch, heads, length, length)) as seen:
            F.scaled_dot_product_attention(query, key, value, attn_mask, dropout_p=dropout)
    return seen.ops


@pytest.mark.parametrize(("mask", "dropout"), [(True, 0.0), (False, 0.0), (True, 0.1)])
def test_a_host_trace_of_attention_builds_the_weights_where_the_cpu_run_does(mask, dropout):
    # A fake CPU tensor goes through torch's own CPU kernel choice (select_sdp_backend_cpp in
    # aten/src/ATen/native/transformers/sdp_utils_cpp.cpp): masks take the CPU flash kernel
    # (no [B, H, T, S] weights), dropout the math path (weights built and kept). So a host
    # trace needs no attention rule, and CPU_STEP_ALLOWANCE covers no attention weights.
    traced = _attention_matrices(fake=True, mask=mask, dropout=dropout)
    assert traced == _attention_matrices(fake=False, mask=mask, dropout=dropout)
    assert bool(traced) == (dropout > 0)
