"""On a GPU target, F.dropout saves CUDA's 1-byte bool mask, not the CPU path's float noise."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode

from vramkit.core.planner.cuda.cuda_rules import DeviceRules
from vramkit.core.planner.cuda.dropout_rules import CudaDropout
from vramkit.core.planner.tracing.fake_trace import FakeStepRecorder, cuda_semantics
from vramkit.core.planner.tracing.run_setup import RunSetup

ELEMENTS = 1 << 20
T4 = DeviceRules(capability=(7, 5), flash_attention=False, mem_efficient_attention=True)


def _saved_bytes_after_dropout(setup: RunSetup) -> int:
    """Bytes alive after `y = dropout(x)`, beyond x and y: what backward keeps."""
    with cuda_semantics(setup), FakeTensorMode():
        x = torch.randn(ELEMENTS, requires_grad=True)
        recorder = FakeStepRecorder(scalar_stand_in=1, round_to_device=True, keep_timeline=False)
        with recorder:
            y = F.dropout(x, 0.1, training=True)
            saved = recorder.current - y.untyped_storage().nbytes()
        del y
        recorder.close()
    return saved


def test_a_gpu_target_saves_one_byte_per_element():
    assert _saved_bytes_after_dropout(RunSetup(precision="32-true", device=T4)) == ELEMENTS


def test_a_cpu_plan_keeps_the_cpu_float_noise():
    assert _saved_bytes_after_dropout(RunSetup(precision="32-true", device=None)) == 4 * ELEMENTS


def test_eval_and_edge_probabilities_behave_as_dropout():
    x = torch.randn(64)
    with CudaDropout() as rule:
        assert F.dropout(x, 0.5, training=False) is x
        assert F.dropout(x, 0.0, training=True) is x
        assert torch.equal(F.dropout(x, 1.0, training=True), torch.zeros(64))
        kept = F.dropout(x, 0.5, training=True)
    assert rule.fused_calls == 1
    nonzero = kept != 0
    assert torch.allclose(kept[nonzero], 2 * x[nonzero])  # survivors scaled by 1 / (1 - p)
