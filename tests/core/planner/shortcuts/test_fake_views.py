"""Views of fake tensors made by their meta kernel equal what the fake mode makes."""

from __future__ import annotations

import pytest
import torch
from fake_metadata import metadata
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

from vramkit.core.planner.shortcuts.fake_views import VIEW_OPS, fake_view, takes_fast_view

aten = torch.ops.aten

CALLS = [
    (aten.view.default, ([6, 4],)),
    (aten._unsafe_view.default, ([24],)),
    (aten.t.default, ()),
    (aten.transpose.int, (0, 1)),
    (aten.permute.default, ([1, 0],)),
    (aten.slice.Tensor, (1, 1, 3)),
    (aten.select.int, (0, 2)),
    (aten.unsqueeze.default, (1,)),
    (aten.squeeze.dim, (0,)),
    (aten.expand.default, ([2, 4, 6],)),
    (aten.detach.default, ()),
    (aten.alias.default, ()),
]


def test_every_view_op_is_covered():
    assert {call[0] for call in CALLS} == VIEW_OPS


@pytest.mark.parametrize(("op", "extra"), CALLS, ids=[str(call[0]) for call in CALLS])
@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
def test_a_fast_view_has_the_fake_modes_metadata_and_storage(op, extra, layout):
    with FakeTensorMode():
        source = torch.empty(4, 6, dtype=torch.bfloat16)
        if layout == "transposed":
            source = torch.empty(6, 4, dtype=torch.bfloat16).t()
        if op in (aten.view.default, aten._unsafe_view.default) and layout == "transposed":
            extra = ([4, 6],)  # a transposed tensor views only as its own shape
        args = (source, *extra)
        assert takes_fast_view(op, args, {})
        fast = fake_view(op, args)
        slow = op(*args)
    assert isinstance(fast, FakeTensor)
    assert metadata(fast) == metadata(slow)
    assert fast.untyped_storage()._cdata == source.untyped_storage()._cdata  # no allocation


def test_constants_and_real_tensors_go_through_the_fake_mode():
    with FakeTensorMode():
        constant = torch.tensor(2.0)  # one element: the fake mode keeps its value
    assert constant.constant is not None
    assert not takes_fast_view(aten.alias.default, (constant,), {})
    assert not takes_fast_view(aten.t.default, (torch.zeros(2, 2),), {})
    assert not takes_fast_view(aten.clone.default, (torch.zeros(2, 2),), {})
