"""The planner builds a module that compiles itself in `configure_model` without compiling:
the trace runs eager code, and making the compiled callable imported torch._inductor."""

from __future__ import annotations

import lightning as L
import pytest
import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

from vramkit.core.planner.tracing.run_setup import RunSetup
from vramkit.core.planner.tracing.subject import build_module


class SelfCompiling(L.LightningModule):
    """Compiles its network in place in `configure_model`, as `ScheduledOptimization` does."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(4, 4)

    def configure_model(self) -> None:
        self.net.compile()


def test_configure_model_compiles_nothing_and_leaves_compile_as_it_was(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the planner called torch.compile")

    monkeypatch.setattr(torch, "compile", refuse)
    built = build_module(
        SelfCompiling, RunSetup(precision="32-true", device=None), FakeTensorMode()
    )
    assert built.net._compiled_call_impl is None  # traced eager
    with pytest.raises(AssertionError, match=r"called torch\.compile"):
        nn.Linear(2, 2).compile()  # nn.Module.compile is itself again after the build
