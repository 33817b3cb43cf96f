"""Each name of vramkit/core/compat/torch_private.py on the installed torch: these fail when a
torch release renames one or changes what it takes or returns."""

from __future__ import annotations

import math

import torch
from torch import nn

from vramkit.core.compat import torch_private


def test_batchnorm_base_is_the_base_of_every_batchnorm():
    for layer in (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm):
        assert issubclass(layer, torch_private.BatchNormBase)
    assert not issubclass(nn.LayerNorm, torch_private.BatchNormBase)
    assert hasattr(torch_private.BatchNormBase, "_check_input_dim")


def test_grouping_by_device_and_dtype_keeps_each_tensor_in_its_group():
    halves = [torch.ones(2, dtype=torch.float16), torch.ones(3, dtype=torch.float16)]
    singles = [torch.ones(4)]
    groups = torch_private.group_tensors_by_device_and_dtype([[singles[0], *halves]], False)
    cpu = torch.device("cpu")
    assert set(groups) == {(cpu, torch.float16), (cpu, torch.float32)}
    ((half_group,), _) = groups[(cpu, torch.float16)]
    assert [t.numel() for t in half_group] == [2, 3]
    assert all(a is b for a, b in zip(half_group, halves, strict=True))


def test_the_fused_check_flags_non_finite_values_and_unscales():
    found_inf, inv_scale = torch.zeros(()), torch.full((), 0.5)
    finite = [torch.full((3,), 4.0)]
    torch_private.non_finite_check_and_unscale_(finite, found_inf, inv_scale)
    assert found_inf.item() == 0 and finite[0].tolist() == [2.0, 2.0, 2.0]
    with_nan = [torch.tensor([1.0, math.nan])]
    torch_private.non_finite_check_and_unscale_(with_nan, found_inf, inv_scale)
    assert found_inf.item() == 1


def test_foreach_max_norm_is_the_largest_magnitude_and_carries_nan():
    norms = torch_private.foreach_max_norm([torch.tensor([1.0, -3.0]), torch.tensor([math.nan])])
    assert norms[0].item() == 3.0 and math.isnan(norms[1].item())


def test_tree_leaves_flattens_loaders_in_order():
    assert torch_private.tree_leaves({"a": [1, 2], "b": (3,)}) == [1, 2, 3]
    assert torch_private.tree_leaves("loader") == ["loader"]


def test_is_compiled_sees_both_ways_of_compiling():
    assert not torch_private.is_compiled(nn.Linear(2, 2))
    assert torch_private.is_compiled(torch.compile(nn.Linear(2, 2)))  # compiles on the first call
    in_place = nn.Linear(2, 2)
    in_place.compile()
    assert torch_private.is_compiled(in_place)
