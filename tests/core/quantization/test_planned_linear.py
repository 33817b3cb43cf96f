"""The 4-bit / 8-bit stand-in holds, casts and saves what bitsandbytes' layers do.

Compared with the installed bitsandbytes where it runs on the CPU (its CPU backend quantizes and
runs `Linear4bit`); the version rules are checked against `bitsandbytes_rules_of`.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from vramkit.core.quantization.bitsandbytes_rules import bitsandbytes_rules_of
from vramkit.core.quantization.planned_linear import (
    PlannedQuantizedLinear,
    plan_quantized_linears,
    quantized_weight_shapes,
)


def _nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _quant_state_tensors(state) -> list[torch.Tensor]:
    tensors = [state.absmax, state.code]
    if state.nested:
        tensors += [state.offset, state.state2.absmax, state.state2.code]
    return tensors


@pytest.mark.parametrize("double_quant", [True, False], ids=["double", "single"])
@pytest.mark.parametrize("quant_type", ["nf4", "fp4"])
def test_the_quant_state_has_bitsandbytes_sizes(quant_type, double_quant):
    bnb = pytest.importorskip("bitsandbytes")
    dense = torch.randn(192, 320, dtype=torch.bfloat16)
    packed, state = bnb.functional.quantize_4bit(
        dense, blocksize=64, compress_statistics=double_quant, quant_type=quant_type
    )
    planned = PlannedQuantizedLinear(
        320, 192, bias=False, kind="4bit", quant_type=quant_type, double_quant=double_quant
    )
    assert planned.weight.shape == packed.shape and planned.weight.dtype == packed.dtype
    real = sorted((tuple(t.shape), t.dtype) for t in _quant_state_tensors(state))
    stand_in = sorted((tuple(t.shape), t.dtype) for t in planned.buffers())
    assert stand_in == real


def test_double_quantization_stores_less_than_fp32_absmax():
    single = quantized_weight_shapes(4096, 4096, "4bit", double_quant=False)
    double = quantized_weight_shapes(4096, 4096, "4bit", double_quant=True)
    size = lambda shapes: sum(  # noqa: E731
        torch.empty(shape, dtype=dtype).nbytes for shape, dtype in shapes.values()
    )
    # 4.5 bits per weight without, about 4.127 with (the QLoRA paper's 0.373 bits saved)
    assert size(single) == 4096 * 4096 // 2 + 4096 * 4096 // 64 * 4 + 16 * 4
    assert size(double) < size(single) - 4096 * 4096 * 0.37 / 8


@pytest.mark.parametrize(
    ("input_dtype", "compute_dtype", "autocast"),
    [
        (torch.float32, torch.bfloat16, False),
        (torch.float32, None, True),
        (torch.float32, torch.bfloat16, True),
        (torch.bfloat16, None, False),
        (torch.bfloat16, torch.float32, False),
    ],
)
def test_the_output_has_the_dtype_bitsandbytes_returns(input_dtype, compute_dtype, autocast):
    """`Linear4bit.forward` casts the input to the compute dtype and the output back."""
    bnb = pytest.importorskip("bitsandbytes")
    real = bnb.nn.Linear4bit(64, 32, bias=True, compute_dtype=compute_dtype, quant_type="nf4")
    real.load_state_dict(nn.Linear(64, 32).to(torch.bfloat16).state_dict())
    real = real.to("cpu")
    planned = PlannedQuantizedLinear(
        64, 32, bias=True, kind="4bit", compute_dtype=compute_dtype, dtype=torch.bfloat16
    )
    x = torch.randn(3, 5, 64, dtype=input_dtype, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        expected = real(x)
        got = planned(x)
    assert got.dtype == expected.dtype == input_dtype
    assert planned.compute_dtype == real.compute_dtype


def _saved_bytes(layer: nn.Module, x: torch.Tensor) -> int:
    saved: dict[int, torch.Tensor] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        saved[id(tensor)] = tensor
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        layer(x)
    return _nbytes(saved.values())


@pytest.mark.parametrize(("version", "keeps"), [("0.43.1", True), ("0.43.2", False)])
def test_what_a_4bit_layer_saves_for_backward_follows_the_bitsandbytes_version(version, keeps):
    """Up to 0.43.1 `MatMul4Bit` kept its (cast) input; PR #1270 (0.43.2) dropped it."""
    with bitsandbytes_rules_of(version):
        parent = nn.Module()
        parent.proj = nn.Linear(256, 128, bias=False, dtype=torch.bfloat16)
        plan_quantized_linears(
            [(parent, "proj", parent.proj)], "4bit", compute_dtype=torch.bfloat16
        )
    layer = parent.proj
    x = torch.randn(4, 256, dtype=torch.float32, requires_grad=True)
    cast_input = 4 * 256 * 2  # the bf16 copy the matmul receives
    expected = layer.weight.nbytes + (cast_input if keeps else 0)
    assert _saved_bytes(layer, x) == expected
    layer(x).sum().backward()
    assert x.grad.shape == x.shape and x.grad.dtype == torch.float32


def test_an_8bit_layer_keeps_its_input_for_backward():
    layer = PlannedQuantizedLinear(256, 128, bias=False, kind="8bit", dtype=torch.float16)
    x = torch.randn(4, 256, dtype=torch.float16, requires_grad=True)
    assert _saved_bytes(layer, x) == layer.weight.nbytes + x.nbytes
    assert layer(x).dtype == torch.float16


def test_unknown_settings_are_refused():
    with pytest.raises(ValueError, match="quant_type"):
        PlannedQuantizedLinear(8, 8, bias=False, kind="4bit", quant_type="int4")
    with pytest.raises(ValueError, match="quantization"):
        plan_quantized_linears([], "3bit")
