"""callbacks.activation_offload: what a training forward saves goes through save_on_cpu."""

from __future__ import annotations

import torch
from torch import nn

from vramkit.core.callbacks.memory.activation_offload import ActivationOffload
from vramkit.core.trainer_assembly.working_set import MayHaveNothingToDo


class CountingSaveOnCpu(torch.autograd.graph.save_on_cpu):
    packed = 0

    def __init__(self, pin_memory: bool = False, device_type: str = "cuda") -> None:
        super().__init__(pin_memory=pin_memory, device_type=device_type)
        pack = self.pack_hook

        def counting(tensor):
            CountingSaveOnCpu.packed += 1
            return pack(tensor)

        self.pack_hook = counting


def _step(model, x, callback=None):
    model.zero_grad()
    if callback is not None:
        callback.on_train_batch_start(None, None, None, 0)
    loss = model(x).square().mean()
    if callback is not None:
        callback.on_before_backward(None, None, loss)
    loss.backward()
    if callback is not None:
        callback.on_train_batch_end(None, None, None, None, 0)
    return [p.grad.clone() for p in model.parameters()]


def test_offloaded_saves_give_the_same_gradients(monkeypatch):
    monkeypatch.setattr(torch.autograd.graph, "save_on_cpu", CountingSaveOnCpu)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 1))
    x = torch.randn(4, 8)
    expected = _step(model, x)
    CountingSaveOnCpu.packed = 0
    got = _step(model, x, ActivationOffload(enabled=True))
    assert CountingSaveOnCpu.packed > 0  # the forward's saves went through save_on_cpu
    for grad, reference in zip(got, expected, strict=True):
        torch.testing.assert_close(grad, reference)
    packed = CountingSaveOnCpu.packed
    _step(model, x)  # outside a training batch nothing is offloaded any more
    assert CountingSaveOnCpu.packed == packed


def test_an_offload_that_is_off_is_not_registered():
    callback = ActivationOffload()
    assert isinstance(callback, MayHaveNothingToDo)
    assert "enabled is false" in callback.nothing_to_do(None, None)
    assert ActivationOffload(enabled=True).nothing_to_do(None, None) is None
