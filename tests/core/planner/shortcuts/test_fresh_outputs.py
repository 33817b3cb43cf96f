"""`_to_copy` and `zeros_like` outputs made directly equal what the fake mode makes."""

from __future__ import annotations

import pytest
import torch
from fake_metadata import metadata
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

from vramkit.core.planner.shortcuts.fresh_outputs import fresh_output

aten = torch.ops.aten

SHAPES = [(), (7,), (3, 5), (2, 1, 4), (2, 3, 4, 5), (1, 3, 1, 5), (2, 3, 1, 4, 5)]
LAYOUTS = ["contiguous", "channels_last", "transposed", "expanded"]


def _make(shape, layout):
    tensor = torch.empty(shape, dtype=torch.float32)
    if layout == "channels_last" and len(shape) in (4, 5):
        memory_format = torch.channels_last if len(shape) == 4 else torch.channels_last_3d
        tensor = tensor.contiguous(memory_format=memory_format)
    elif layout == "transposed" and len(shape) >= 2:
        tensor = torch.empty(shape[::-1], dtype=torch.float32).transpose(0, -1)
    elif layout == "expanded" and len(shape) >= 1:
        tensor = torch.empty((1, *shape[1:]), dtype=torch.float32).expand(shape)
    return tensor


CALLS = [
    (aten._to_copy.default, {"dtype": torch.float16}),
    (aten._to_copy.default, {"dtype": torch.bfloat16, "memory_format": torch.preserve_format}),
    (aten._to_copy.default, {"dtype": torch.float64, "layout": torch.strided, "device": "cpu"}),
    (aten.zeros_like.default, {}),
    (aten.zeros_like.default, {"memory_format": torch.preserve_format}),
    (aten.zeros_like.default, {"dtype": torch.int64}),
]


@pytest.mark.parametrize(("op", "kwargs"), CALLS)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_a_direct_output_has_the_fake_modesmetadata(op, kwargs, layout, shape):
    with FakeTensorMode():
        source = _make(shape, layout)
        direct = fresh_output(op, (source,), kwargs)
        dispatched = op(source, **kwargs)
    if direct is None:
        return  # the fake mode answers: nothing to compare
    assert isinstance(direct, FakeTensor)
    assert metadata(direct) == metadata(dispatched)
    assert direct.untyped_storage()._cdata != source.untyped_storage()._cdata  # fresh


@pytest.mark.parametrize(
    ("op", "kwargs", "made"),
    [
        (aten._to_copy.default, {"dtype": torch.float16}, True),
        (aten._to_copy.default, {"dtype": torch.float32}, False),  # no conversion: a clone
        (aten._to_copy.default, {"dtype": torch.float16, "device": "meta"}, False),
        (aten._to_copy.default, {"dtype": torch.float16, "pin_memory": True}, False),
        (aten._to_copy.default, {"memory_format": torch.channels_last}, False),
        (aten.zeros_like.default, {"memory_format": torch.contiguous_format}, False),
        (aten.zeros_like.default, {}, True),
        (aten.add.Tensor, {}, False),
    ],
)
def test_what_the_rules_answer_and_what_they_leave_to_the_fake_mode(op, kwargs, made):
    with FakeTensorMode():
        source = torch.empty(2, 3)
        args = (source, source) if op is aten.add.Tensor else (source,)
        assert (fresh_output(op, args, kwargs) is not None) is made


def test_layouts_the_rules_answer():
    answered = set()
    for layout in LAYOUTS:
        with FakeTensorMode():
            source = _make((2, 3, 4, 5), layout)
            if fresh_output(aten.zeros_like.default, (source,), {}) is not None:
                answered.add(layout)
    assert answered == {"contiguous", "channels_last"}


def test_constants_are_left_to_the_fake_mode():
    with FakeTensorMode():
        constant = torch.tensor(1.0)
        assert fresh_output(aten._to_copy.default, (constant,), {"dtype": torch.float16}) is None


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_a_foreach_square_root_is_one_fresh_tensor_like_each_input(dtype):
    with FakeTensorMode():
        tensors = [
            _make(shape, layout).to(dtype)
            for shape, layout in [
                ((3, 5), "contiguous"),
                ((2, 3, 4, 5), "channels_last"),
                ((7,), "contiguous"),
            ]
        ]
        direct = fresh_output(aten._foreach_sqrt.default, (tensors,), {})
        dispatched = aten._foreach_sqrt.default(tensors)
    assert [metadata(t) for t in direct] == [metadata(t) for t in dispatched]


def test_a_foreach_square_root_with_an_odd_layout_is_left_to_the_fake_mode():
    with FakeTensorMode():
        tensors = [torch.empty(3, 5), _make((3, 5), "transposed")]
        assert fresh_output(aten._foreach_sqrt.default, (tensors,), {}) is None
        integers = [torch.empty(3, dtype=torch.int64)]
        assert fresh_output(aten._foreach_sqrt.default, (integers,), {}) is None
