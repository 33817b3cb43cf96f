"""The CUDA rules a CPU trace applies: rounding, autocast lists and cache, attention kernels."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode

from vramkit.core.planner.cuda.attention_rules import CudaAttention
from vramkit.core.planner.cuda.autocast_rules import (
    CUDNN_RNN,
    CudaAutocast,
    cuda_autocast_table,
    policy_ops,
    registered_cuda_ops,
    unmodelled_cuda_ops,
)
from vramkit.core.planner.cuda.cuda_rules import (
    EFFICIENT,
    FLASH,
    GIB,
    MATH,
    DeviceRules,
    round_allocation,
)
from vramkit.core.planner.cuda.tested_torch import is_cuda_build
from vramkit.core.planner.tracing.fake_trace import FakeStepRecorder
from vramkit.core.planner.tracing.recorder import StorageRecorder
from vramkit.core.units import MIB

T4 = DeviceRules(capability=(7, 5), flash_attention=False, mem_efficient_attention=True)
ADA = DeviceRules(capability=(8, 9), flash_attention=True, mem_efficient_attention=True)


@pytest.mark.parametrize(
    ("requested", "allocated"), [(0, 0), (1, 512), (512, 512), (513, 1024), (10**6, 1000448)]
)
def test_blocks_round_up_to_512_bytes(requested, allocated):
    assert round_allocation(requested) == allocated


def test_the_op_lists_are_the_installed_torch_cuda_autocast_lists():
    # The table's rows for this version and build are what this torch registers, in both
    # directions: cuDNN's `_cudnn_rnn` is there on a CUDA build and absent on a CPU build.
    assert set(cuda_autocast_table(cuda_build=is_cuda_build())) == set(registered_cuda_ops())
    assert ("_cudnn_rnn" in registered_cuda_ops()) is is_cuda_build()
    assert unmodelled_cuda_ops() == frozenset()


def test_the_planner_models_the_cuda_build_of_the_installed_version():
    modelled = policy_ops()
    assert modelled == cuda_autocast_table()
    assert modelled["_cudnn_rnn"] == CUDNN_RNN  # on a CPU build too: the GPU run has cuDNN


def test_ops_new_in_a_version_follow_the_installed_torch():
    assert "linalg_matrix_sqrth" not in cuda_autocast_table("2.13.0")
    assert cuda_autocast_table("2.14.1+cu130")["linalg_matrix_sqrth"] == "fp32"
    assert "_cudnn_rnn" not in cuda_autocast_table("2.14.1", cuda_build=False)
    has_op = hasattr(torch.ops.aten, "linalg_matrix_sqrth")
    assert has_op is ("linalg_matrix_sqrth" in cuda_autocast_table())


def _cuda_autocast_dtype(call) -> torch.dtype:
    """The dtype the installed torch's own CUDA autocast kernels give, on fake CUDA tensors.

    `torch.autocast("cuda")` turns itself off without a GPU; the low-level switch does not, and
    fake CUDA tensors reach the real AutocastCUDA kernels on either build without touching CUDA.
    """
    dtype = torch.get_autocast_dtype("cuda")
    torch.set_autocast_enabled("cuda", True)
    torch.set_autocast_dtype("cuda", torch.float16)
    try:
        x = torch.empty(4, 4, device="cuda")
        return call(x, x.half()).dtype
    finally:
        torch.set_autocast_enabled("cuda", False)
        torch.set_autocast_dtype("cuda", dtype)
        torch.clear_autocast_cache()


AUTOCAST_CALLS = {
    "mm": lambda x, h: torch.mm(x, x),
    "exp": lambda x, h: torch.exp(h),
    "sum": lambda x, h: h.sum(),
    "log_softmax": lambda x, h: torch.log_softmax(h, -1),
    "addcmul": lambda x, h: torch.addcmul(x, h, h),
    "cat": lambda x, h: torch.cat([x, h]),  # in no CUDA list (CPU autocast casts it)
    "linalg_matrix_sqrth": lambda x, h: torch.ops.aten.linalg_matrix_sqrth(h),
}


@pytest.mark.parametrize("name", sorted(AUTOCAST_CALLS))
def test_the_emulation_casts_as_the_installed_cuda_kernels_do(name):
    if not hasattr(torch.ops.aten, name):
        # Only an op the table leaves out of this torch may be missing from it: one it models
        # here must exist, or the table's version rows are wrong. That is all there is to check.
        assert name not in cuda_autocast_table(), f"the table models aten::{name} here"
        return
    call = AUTOCAST_CALLS[name]
    with FakeTensorMode():
        real = _cuda_autocast_dtype(call)
        x = torch.empty(4, 4)
        with CudaAutocast(torch.float16) as autocast, autocast.region():
            emulated = call(x, x.half()).dtype
    assert emulated == real


def test_overhead_is_context_plus_what_the_allocator_reserves_beyond_the_peak():
    # A 100 MiB tensor freed, then a 120 MiB one that cannot reuse its block: both segments stay
    # reserved; the two 8.1 MiB cuBLAS workspaces share one 20 MiB segment (the second fits in
    # the split-off rest of the first). cuDNN's convolution workspaces are not an allowance
    # here: the trace charges each at its op (test_op_rules.py, cuDNN convolution workspace).
    events = [(0, 100 * MIB), (0, 0), (1, 120 * MIB)]
    allocated = 120 * MIB
    overhead = T4.overhead_bytes(allocated, events, backward=True)
    reserved = 100 * MIB + 120 * MIB + 20 * MIB
    assert overhead == T4.cuda_context_bytes() + reserved - allocated
    # A pattern the allocator packs tightly still gets the measured floor of 1.12.
    packed = T4.overhead_bytes(GIB, [(0, GIB)], backward=False)
    workspace = T4.workspace_bytes(backward=False)
    assert packed == T4.cuda_context_bytes() + round(1.12 * (GIB + workspace)) - GIB
    assert T4.workspace_bytes(backward=True) == 2 * T4.workspace_bytes(backward=False)


@pytest.mark.parametrize(
    ("rules", "dtype", "mask", "kernel"),
    [
        (T4, torch.float16, False, EFFICIENT),  # no flash below sm_80
        (T4, torch.bfloat16, False, MATH),  # bf16 attention on sm_75 falls back to math
        (T4, torch.float32, True, EFFICIENT),
        (ADA, torch.bfloat16, False, FLASH),
        (ADA, torch.float16, True, EFFICIENT),  # flash takes no explicit mask
        (ADA, torch.float32, False, EFFICIENT),  # flash is 16-bit only
    ],
)
def test_attention_kernel_follows_the_capability(rules, dtype, mask, kernel):
    assert rules.sdpa_backend(dtype, 64, has_mask=mask) == kernel


def test_mixed_precision_follows_cuda_lists_not_cpu_lists():
    fake_mode = FakeTensorMode()
    with fake_mode:
        weight = torch.nn.Parameter(torch.empty(8, 8))
        x = torch.empty(4, 8)
        volume = torch.empty(1, 2, 4, 4, 4, dtype=torch.float16)
        target = torch.empty(4)
    with fake_mode, CudaAutocast(torch.float16) as autocast, autocast.region():
        assert F.linear(x, weight).dtype == torch.float16  # lower precision on CUDA
        assert torch.exp(x.half()).dtype == torch.float32  # fp32 on CUDA, untouched on CPU
        assert x.half().sum().dtype == torch.float32  # CUDA sets sum's output dtype
        assert F.avg_pool3d(volume, 2).dtype == torch.float16  # CPU autocast would upcast it
        with pytest.raises(RuntimeError, match="binary_cross_entropy_with_logits"):
            F.binary_cross_entropy(target, target)
    with fake_mode, torch.autocast("cpu", dtype=torch.float16):
        assert F.avg_pool3d(volume, 2).dtype == torch.float32  # the rules are gone again


def test_a_weight_is_cast_once_per_region_and_the_copy_freed_after_it():
    with FakeTensorMode():
        weight = torch.nn.Parameter(torch.empty(1024, 1024))
        x = torch.empty(2, 1024)
        recorder = FakeStepRecorder(scalar_stand_in=1, round_to_device=True, keep_timeline=False)
        with CudaAutocast(torch.float16) as autocast, recorder:
            recorder.register([weight, x], "parameters")
            with autocast.region():
                outputs = [F.linear(x, weight) for _ in range(3)]
                during = recorder.current
            del outputs
            after = recorder.current
    fp16_copy = 1024 * 1024 * 2
    inputs_and_outputs = 3 * 4096 + 3 * 4096  # three fp16 casts of x (saved), three outputs
    assert during - (4 * 1024 * 1024 + 2 * 1024 * 4) == fp16_copy + inputs_and_outputs
    assert after == 4 * 1024 * 1024 + 2 * 1024 * 4


def attention_peak(rules: DeviceRules, dtype: torch.dtype) -> tuple[int, list[str]]:
    with FakeTensorMode():
        q = torch.empty(2, 8, 512, 64, dtype=dtype, requires_grad=True)
        recorder = FakeStepRecorder(scalar_stand_in=1, round_to_device=True, keep_timeline=False)
        with CudaAttention(rules) as attention, recorder:
            F.scaled_dot_product_attention(q, q, q).sum().backward()
    return recorder.peak.bytes, attention.choices


def test_the_math_path_materialises_the_attention_matrix():
    math_peak, math_choices = attention_peak(T4, torch.bfloat16)
    flash_peak, flash_choices = attention_peak(ADA, torch.bfloat16)
    assert (math_choices, flash_choices) == ([MATH], [FLASH])
    scores = 2 * 8 * 512 * 512 * 2  # one bf16 (B, H, L, L) matrix
    assert math_peak - flash_peak >= scores


def test_values_a_fake_tensor_lacks_get_worst_case_stand_ins():
    with FakeTensorMode():
        scores = torch.empty(4, 100)
        recorder = FakeStepRecorder(scalar_stand_in=400, round_to_device=True, keep_timeline=False)
        with recorder:
            count = int((scores > 0.5).sum())
            assert count == 400  # sizes a buffer: the largest it could be
            assert bool((scores > 0).any()) is True
            assert torch.nonzero(scores).shape == (400, 2)
            assert torch.masked_select(scores, scores > 0).shape == (400,)
            assert torch.topk(scores.flatten(), min(count, scores.numel())).values.shape == (400,)


def test_tensors_without_a_storage_are_left_out_of_the_count():
    recorder = StorageRecorder()
    dense = torch.zeros(256, dtype=torch.uint8)
    with torch.sparse.check_sparse_tensor_invariants(False):
        sparse = torch.sparse_coo_tensor(torch.tensor([[0], [0]]), torch.tensor([1.0]), (2, 2))
    recorder.register([sparse, dense, None], "inputs")
    assert recorder.current == 256  # the dense tensor only; the sparse one has no storage
    recorder.close()


def test_the_cuda_context_follows_module_loading(monkeypatch):
    lazy = DeviceRules(capability=(7, 5), flash_attention=False, mem_efficient_attention=True)
    eager = DeviceRules(
        capability=(7, 0),
        flash_attention=False,
        mem_efficient_attention=True,
        lazy_module_loading=False,
    )
    # Measured: 0.60 GiB (A10G, lazy) and 1343 MiB (V100, eager); see cuda_rules.py.
    assert lazy.cuda_context_bytes() == round(0.60 * GIB)
    assert eager.cuda_context_bytes() == 1343 * 2**20
    assert (
        eager.overhead_bytes(GIB, [(0, GIB)], backward=True)
        - lazy.overhead_bytes(GIB, [(0, GIB)], backward=True)
        == eager.cuda_context_bytes() - lazy.cuda_context_bytes()
    )


def test_module_loading_is_read_from_the_environment_and_the_cuda_version(monkeypatch):
    from vramkit.core.planner.cuda.cuda_rules import lazy_module_loading

    monkeypatch.setattr(torch.version, "cuda", "12.4")
    monkeypatch.delenv("CUDA_MODULE_LOADING", raising=False)
    assert lazy_module_loading() is True
    monkeypatch.setenv("CUDA_MODULE_LOADING", "EAGER")
    assert lazy_module_loading() is False
    monkeypatch.delenv("CUDA_MODULE_LOADING")
    monkeypatch.setattr(torch.version, "cuda", "11.6")
    assert lazy_module_loading() is False
