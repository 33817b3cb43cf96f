"""A guarded step that runs whole does what the plain module does and nothing more: the same
tensor operations (but a detach), no hook, no per-step walk over the parameters, no binding
of log calls."""

from __future__ import annotations

import functools
import inspect
from collections import Counter
from typing import Any

import lightning as L
import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.data import DataLoader, TensorDataset

from vramkit.core.oom.resilient_module import OOMResilientModule

STEPS_PER_EPOCH = 4
EPOCHS = 2


class _OpCounter(TorchDispatchMode):
    """Counts the aten operations run while it is active."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[str(func)] += 1
        return func(*args, **(kwargs or {}))


class _CountStepOps(L.Callback):
    """Counts the tensor operations of the training steps only (step, backward, update)."""

    def __init__(self) -> None:
        self.counter = _OpCounter()

    def on_train_batch_start(self, *_: Any) -> None:
        self.counter.__enter__()

    def on_train_batch_end(self, *_: Any) -> None:
        self.counter.__exit__(None, None, None)


def _training_step(module: L.LightningModule, batch: list[torch.Tensor]) -> torch.Tensor:
    x, y = batch
    loss = F.mse_loss(module.net(x).squeeze(-1), y)
    module.log("train/loss", loss, prog_bar=True, batch_size=len(y))
    return loss


class _Plain(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        return _training_step(self, batch)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


class _Guarded(OOMResilientModule):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        return _training_step(self, batch)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _fit(module: L.LightningModule, accumulate: int = 1) -> _CountStepOps:
    counter = _CountStepOps()
    trainer = L.Trainer(
        accelerator="cpu",
        max_epochs=EPOCHS,
        accumulate_grad_batches=accumulate,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[counter],
    )
    generator = torch.Generator().manual_seed(0)
    samples = 8 * STEPS_PER_EPOCH
    data = TensorDataset(
        torch.randn(samples, 4, generator=generator), torch.randn(samples, generator=generator)
    )
    trainer.fit(module, train_dataloaders=DataLoader(data, batch_size=8))
    return counter


def _counting(monkeypatch: pytest.MonkeyPatch, owner: Any, name: str) -> list[int]:
    calls: list[int] = []
    original = getattr(owner, name)

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, counted)
    return calls


def test_a_whole_step_runs_the_plain_modules_operations_and_nothing_else(monkeypatch):
    plain, guarded = _Plain(), _Guarded()
    plain_ops = _fit(plain).counter.ops
    hooks = _counting(monkeypatch, torch.Tensor, "register_post_accumulate_grad_hook")
    bindings = _counting(monkeypatch, inspect.Signature, "bind")
    guarded_ops = _fit(guarded).counter.ops
    steps = STEPS_PER_EPOCH * EPOCHS
    assert sum(plain_ops.values()) > 10 * steps
    # The only extra operation is the detach of the loss handed back to Lightning; and the
    # guard's backward pass skips Lightning's division by accumulate_grad_batches (1).
    assert guarded_ops - plain_ops == Counter({"aten.detach.default": steps})
    assert plain_ops - guarded_ops == Counter({"aten.div.Tensor": steps})
    assert hooks == [] and bindings == []
    for mine, theirs in zip(guarded.parameters(), plain.parameters(), strict=True):
        assert torch.equal(mine, theirs)


@pytest.mark.parametrize("accumulate", [1, 2])
def test_the_parameters_are_walked_once_per_epoch_not_per_step(monkeypatch, accumulate):
    walks = {}
    for module in (_Plain(), _Guarded()):
        walks[type(module)] = _counting(monkeypatch, module, "parameters")
        hooks = _counting(monkeypatch, torch.Tensor, "register_post_accumulate_grad_hook")
        _fit(module, accumulate)
    assert len(walks[_Guarded]) - len(walks[_Plain]) == EPOCHS
    # with accumulation the arrival hooks are installed once per epoch, one per tensor
    trainable = sum(1 for p in module.parameters() if p.requires_grad)
    assert len(hooks) == (EPOCHS * trainable if accumulate > 1 else 0)


def _note_gradient(seen: list[bool], parameter: torch.Tensor, *_: Any) -> None:
    seen.append(parameter.grad is not None)


@pytest.mark.parametrize("accumulate", [1, 2])
def test_the_previous_gradients_are_freed_where_lightning_frees_them(accumulate):
    # The order of the host's frees decides how often glibc hands heap back to the kernel and
    # faults it in again (guarded_steps.train_whole_batch): the guarded step zeroes after the
    # forward, as Lightning's closure does, so a forward sees the same gradients alive.
    alive_at_forward: dict[type, list[bool]] = {}
    for module in (_Plain(), _Guarded()):
        seen = alive_at_forward.setdefault(type(module), [])
        module.net.register_forward_pre_hook(
            functools.partial(_note_gradient, seen, next(module.net.parameters()))
        )
        _fit(module, accumulate)
    assert len(alive_at_forward[_Plain]) == STEPS_PER_EPOCH * EPOCHS
    assert any(alive_at_forward[_Plain]) and not all(alive_at_forward[_Plain])
    assert alive_at_forward[_Guarded] == alive_at_forward[_Plain]
