"""Fake constants made directly equal the fake mode's, behave as its do, and leave a trace as is."""

from __future__ import annotations

import pytest
import torch
from fake_metadata import metadata
from fake_traces import assert_same_trace, traced_with_and_without
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

from vramkit.core.planner.shortcuts.fake_constants import lifted_constant

aten = torch.ops.aten

VALUES = [(0.0, torch.float32), (1.5, torch.float64), (3, torch.int64), (True, torch.bool)]


@pytest.mark.parametrize(("value", "dtype"), VALUES)
def test_a_lifted_constant_is_the_fake_modes(value, dtype):
    real = torch.tensor(value, dtype=dtype)
    with FakeTensorMode():
        direct = lifted_constant(aten.lift_fresh.default, (real,), {})
        dispatched = torch.tensor(value, dtype=dtype)
        assert isinstance(direct, FakeTensor)
        assert metadata(direct) == metadata(dispatched)
        assert direct.item() == dispatched.item() == value
    assert torch.equal(direct.constant, dispatched.constant)
    assert direct.constant.untyped_storage()._cdata != real.untyped_storage()._cdata  # a copy


def test_a_lifted_constant_follows_writes_as_the_fake_modes_does():
    real = torch.tensor(0.0)
    with FakeTensorMode():
        direct = lifted_constant(aten.lift_fresh.default, (real,), {})
        dispatched = torch.tensor(0.0)
        written = []
        for step in (direct, dispatched):
            before = step
            step += 1
            step.mul_(3)
            written.append(step is before)  # a write returns the tensor written into
        assert written == [True, True]
        assert direct.item() == dispatched.item() == 3.0
        # A write whose value the fake mode cannot know ends the constant, for both alike.
        direct.add_(torch.rand(()))
        dispatched.add_(torch.rand(()))
        assert direct.constant is None and dispatched.constant is None
    assert real.item() == 0.0  # the lifted tensor itself is never written


@pytest.mark.parametrize(
    "case", ["several elements", "requires grad", "fake input", "keyword", "no fake mode"]
)
def test_what_is_left_to_the_fake_mode(case):
    args, kwargs = (torch.tensor(1.0),), {}
    if case == "several elements":
        args = (torch.tensor([1.0, 2.0]),)
    elif case == "requires grad":
        args = (torch.tensor(1.0, requires_grad=True),)
    elif case == "keyword":
        kwargs = {"out": None}
    if case == "no fake mode":
        assert lifted_constant(aten.lift_fresh.default, args, kwargs) is None
        return
    with FakeTensorMode():
        if case == "fake input":
            args = (torch.empty(()),)
        assert lifted_constant(aten.lift_fresh.default, args, kwargs) is None
        assert lifted_constant(aten.lift_fresh_copy.default, (torch.tensor(1.0),), {}) is None


def test_lifting_constants_directly_leaves_the_traced_step_unchanged(monkeypatch):
    direct, dispatched, made = traced_with_and_without(
        monkeypatch,
        "lifted_constant",
        lambda: nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)),
        lambda: torch.empty(8, 16),
        foreach=False,
    )
    assert made == 4  # a step counter per parameter
    assert_same_trace(direct, dispatched)
