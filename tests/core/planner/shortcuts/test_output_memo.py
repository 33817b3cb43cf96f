"""Outputs remade from the memo equal the fake mode's; what it must not remember, it does not."""

from __future__ import annotations

import pytest
import torch
from fake_metadata import metadata
from fake_traces import assert_same_trace, traced_steps
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

from vramkit.core.planner.shortcuts.output_memo import OutputMemo

aten = torch.ops.aten


def _channels_last(*shape):
    return torch.empty(shape).contiguous(memory_format=torch.channels_last)


# name: (op, a function of nothing giving (args, kwargs), made inside the fake mode)
CALLS = {
    "mm": (aten.mm.default, lambda: ((torch.empty(3, 4), torch.empty(4, 5)), {})),
    "mm transposed": (aten.mm.default, lambda: ((torch.empty(4, 3).t(), torch.empty(4, 5)), {})),
    "addmm": (
        aten.addmm.default,
        lambda: ((torch.empty(5), torch.empty(3, 4), torch.empty(4, 5)), {"beta": 0.5}),
    ),
    "sum": (aten.sum.dim_IntList, lambda: ((torch.empty(2, 3, 4), [1], True), {})),
    "layer norm": (
        aten.native_layer_norm.default,
        lambda: ((torch.empty(2, 3, 8), [8], torch.empty(8), None, 1e-5), {}),
    ),
    "cat": (aten.cat.default, lambda: (([torch.empty(2, 3), torch.empty(4, 3)], 0), {})),
    "gelu": (aten.gelu.default, lambda: ((torch.empty(2, 8, dtype=torch.bfloat16),), {})),
    "clone channels-last": (aten.clone.default, lambda: ((_channels_last(2, 3, 4, 5),), {})),
    "empty": (
        aten.empty.memory_format,
        lambda: (([2, 3],), {"dtype": torch.float16, "device": torch.device("cpu")}),
    ),
    "dropout": (aten.native_dropout.default, lambda: ((torch.empty(4, 6), 0.1, True), {})),
    "max pool": (
        aten.max_pool2d_with_indices.default,
        lambda: ((_channels_last(2, 3, 8, 8), [2, 2], [2, 2]), {}),
    ),
    "upsample": (
        aten.upsample_nearest2d.default,
        lambda: ((torch.empty(1, 2, 4, 4), [8, 8]), {}),
    ),
}


def _flat(out):
    return [metadata(t) for t in out] if isinstance(out, tuple) else [metadata(out)]


@pytest.mark.parametrize("name", CALLS)
def test_a_remade_output_has_the_fake_modes_metadata(name):
    op, make = CALLS[name]
    memo = OutputMemo()
    with FakeTensorMode():
        args, kwargs = make()
        first = memo.run(op, args, kwargs, lambda: op(*args, **kwargs))
        again = memo.run(op, args, kwargs, lambda: pytest.fail("dispatched again"))
        dispatched = op(*args, **kwargs)
    assert memo.hits == 1
    assert _flat(again) == _flat(first) == _flat(dispatched)
    outputs = again if isinstance(again, tuple) else (again,)
    assert all(type(t) is FakeTensor for t in outputs)
    # Fresh storages: nothing remade shares one with the first outputs or the inputs.
    first_storages = {t.untyped_storage()._cdata for t in _tensors((first, args))}
    assert not first_storages & {t.untyped_storage()._cdata for t in outputs}


def _tensors(value):
    return [v for v in torch.utils._pytree.tree_leaves(value) if isinstance(v, torch.Tensor)]


@pytest.mark.parametrize("case", ["view", "in place", "lift", "fake constant", "aliasing output"])
def test_what_it_never_remembers(case):
    memo = OutputMemo()
    dispatched = []
    with FakeTensorMode():
        x = torch.empty(3, 4)
        op, args = {
            "view": (aten.t.default, (x,)),
            "in place": (aten.add_.Tensor, (x, x)),
            "lift": (aten.lift_fresh.default, (torch.tensor(1.0),)),
            "fake constant": (aten.mul.Tensor, (torch.tensor(2.0), torch.tensor(3.0))),
            # A functional op handing back its input (a stand-in dispatch that does so).
            "aliasing output": (aten.clone.default, (x,)),
        }[case]
        for _ in range(2):

            def dispatch(op=op, args=args):
                dispatched.append(op)
                return args[0] if case == "aliasing output" else op(*args)

            memo.run(op, args, {}, dispatch)
    assert memo.hits == 0 and len(dispatched) == 2


def test_arguments_without_a_key_are_never_remembered():
    memo = OutputMemo()
    real = torch.empty(4, 2)
    with FakeTensorMode():
        x = torch.empty(3, 4)
        assert memo._key(aten.mm.default, (x, torch.empty(4, 2)), {}) is not None
        assert memo._key(aten.mm.default, (x, real), {}) is None
        assert memo._key(aten.mm.default, (x, object()), {}) is None
        assert memo._key(aten.mm.default, (x, torch.empty(4, 2, device="meta")), {}) is None


def test_the_key_tells_apart_what_changes_an_output():
    memo = OutputMemo()
    with FakeTensorMode():
        x = torch.empty(4, 4)
        keys = {
            memo._key(aten.mul.Tensor, (x, 2), {}),
            memo._key(aten.mul.Tensor, (x, 2.0), {}),
            memo._key(aten.mul.Tensor, (x, True), {}),
            memo._key(aten.mul.Tensor, (x.t(), 2), {}),
            memo._key(aten.mul.Tensor, (x.half(), 2), {}),
            memo._key(aten.mul.Tensor, (x[1:], 2), {}),
        }
        with torch.no_grad():
            keys.add(memo._key(aten.mul.Tensor, (x, 2), {}))
    assert len(keys) == 7


class _Layer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attention = nn.MultiheadAttention(16, 2, batch_first=True)
        self.norm = nn.LayerNorm(16)
        self.mlp = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 16))

    def forward(self, x):
        x = self.norm(x + self.attention(x, x, x, need_weights=False)[0])
        return x + self.mlp(x)


def _two_traces(monkeypatch, *, remember: bool):
    if not remember:
        monkeypatch.setattr(OutputMemo, "run", lambda self, f, a, k, dispatch: dispatch())
    memo = OutputMemo()
    traces = [
        traced_steps(
            lambda: nn.Sequential(_Layer(), _Layer()),
            lambda: torch.empty(2, 12, 16),
            precision="bf16-mixed",
            output_memo=memo,
        )[0]
        for _ in range(2)
    ]
    return traces, memo.hits


def test_remembered_outputs_leave_the_traces_unchanged(monkeypatch):
    remembered, hits = _two_traces(monkeypatch, remember=True)
    monkeypatch.undo()
    dispatched, _ = _two_traces(monkeypatch, remember=False)
    assert hits > 100  # the second layer, the second step and the second trace
    for direct, reference in zip(remembered, dispatched, strict=True):
        assert_same_trace(direct, reference)
