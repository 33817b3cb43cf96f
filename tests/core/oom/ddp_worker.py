"""One process of a two-process DDP fit (gloo, CPU) for test_ddp_recovery.py.

``python ddp_worker.py RANK PORT SCENARIO OUT_DIR``: fits a small regressor as rank RANK of
two and writes ``OUT_DIR/rank<RANK>.json``: how the fit ended, the collectives started from
Python during each training step and in the whole fit, the final weights and what the OOM
guard learned. Scenarios (the fault is on rank 1 only):

- ``split``: rank 1's training micro-batches of more than 2 samples run out of memory;
- ``give_up``: rank 1's backward pass runs out of memory for any number of samples.
"""

from __future__ import annotations

import json
import os
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import lightning as L
import torch
import torch.distributed as dist
from lightning.pytorch.strategies import DDPStrategy
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from vramkit.core.oom.resilient_module import OOMResilientModule

SAMPLES = 16
BATCH = 8  # per process: one step per epoch covers the whole set, in whatever order
EPOCHS = 3
COLLECTIVES = ("all_reduce", "broadcast", "all_gather", "barrier", "reduce", "gather", "scatter")


def points() -> TensorDataset:
    """The regression set every process (and the single-process reference) reads."""
    generator = torch.Generator().manual_seed(1)
    return TensorDataset(
        torch.randn(SAMPLES, 4, generator=generator), torch.randn(SAMPLES, generator=generator)
    )


class _OOMInBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        raise torch.cuda.OutOfMemoryError(f"backward of {grad.shape[0]} samples")


class Regressor(OOMResilientModule):
    """Linear-tanh-linear; ``fail_backward`` makes every backward pass run out of memory."""

    def __init__(self, fail_backward: bool = False) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.first = nn.Linear(4, 8)
        self.second = nn.Linear(8, 1)
        self.fail_backward = fail_backward

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = torch.tanh(self.first(x))
        if self.fail_backward:
            hidden = _OOMInBackward.apply(hidden)
        return self.second(hidden).squeeze(-1)

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.mse_loss(self(x), y)
        self.log("train/loss", loss, batch_size=len(y))
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


class _StepCollectives(L.Callback):
    """Collectives started between the start and the end of each training step."""

    def __init__(self, calls: list[str]) -> None:
        self.calls = calls
        self.per_step: list[int] = []
        self._at_start = 0

    def on_train_batch_start(self, *_: Any) -> None:
        self._at_start = len(self.calls)

    def on_train_batch_end(self, *_: Any) -> None:
        self.per_step.append(len(self.calls) - self._at_start)


def _count_collectives(calls: list[str]) -> None:
    for name in COLLECTIVES:
        original = getattr(dist, name)

        def counted(*args: Any, _name: str = name, _original: Any = original, **kwargs: Any):
            calls.append(_name)
            return _original(*args, **kwargs)

        setattr(dist, name, counted)


def main(rank: int, port: int, scenario: str, out_dir: Path) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        WORLD_SIZE="2",
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        NODE_RANK="0",
    )
    torch.set_num_threads(1)
    calls: list[str] = []
    _count_collectives(calls)
    steps = _StepCollectives(calls)
    module = Regressor(fail_backward=scenario == "give_up" and rank == 1)
    callbacks: list[L.Callback] = [steps]
    if scenario == "split" and rank == 1:
        from vramkit.core.callbacks.memory.oom_fault_injection import OOMFaultInjection

        callbacks.append(OOMFaultInjection(oom_train_above=2))
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        # a collective left waiting fails after 30 s instead of hanging the test
        strategy=DDPStrategy(process_group_backend="gloo", timeout=timedelta(seconds=30)),
        max_epochs=EPOCHS,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=out_dir,
        callbacks=callbacks,
    )
    try:
        trainer.fit(module, train_dataloaders=DataLoader(points(), batch_size=BATCH))
        outcome = "finished"
    except torch.cuda.OutOfMemoryError as error:
        outcome = f"OutOfMemoryError: {error}"
    result = {
        "outcome": outcome,
        "per_step_collectives": steps.per_step,
        "collectives": len(calls),
        "train_micro_batch": module.oom_state.train_micro_batch,
        "weights": {name: value.tolist() for name, value in module.state_dict().items()},
    }
    (out_dir / f"rank{rank}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], Path(sys.argv[4]))
