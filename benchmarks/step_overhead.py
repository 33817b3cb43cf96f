"""What vramkit's safety costs per training step when nothing goes wrong.

A model so small that its compute is negligible (Linear-ReLU-Linear, batch 8, CPU, one
thread) makes every microsecond of framework work visible. Each round runs, in an order that
rotates from round to round so drifting load hits every side alike:

- ``plain``: a PyTorch loop over the same loader (zero_grad, forward, backward, step);
- ``lightning``: a bare Lightning ``Trainer`` (no callbacks, no progress bar, the CSV logger)
  fitting a ``LightningModule`` built like vramkit's (one ``self.log`` per step, a per-step
  learning-rate schedule);
- ``vramkit``: the same module on :class:`~vramkit.core.oom.resilient_module.OOMResilientModule`
  with the callbacks ``train.py`` registers from ``conf/callbacks`` and the atomic checkpoint
  plugin;
- the OOM guard alone, at 4, 100 and 600 parameter tensors (the extra tensors are scalars
  added to the output, so their compute stays small): one fit under the bare Trainer whose
  steps alternate between guarded and unguarded (a step marked as nested runs without the
  guard, as a subclass's ``super().training_step`` does), so both kinds share the same
  moment's load.

A step's cost is the CPU time of this process (all its threads: a progress bar's refresh
thread counts) from one ``training_step`` to the next, averaged over the steps after a
warm-up, so set-up and the end-of-fit checkpoint do not count. Objects alive before a run
(the imports) are frozen out of the garbage collector, whose full passes over them would add
tens of milliseconds at random steps. Differences are paired within a round and summarised
by their median over rounds with their spread (min, max); ``guard_us_per_param_tensor`` is
the slope of the guard's cost from 4 to 600 tensors.

``python -m benchmarks.step_overhead [--rounds N] [--steps N]`` writes
``results/step_overhead.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import itertools
import os
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.loggers import CSVLogger
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, Dataset

from benchmarks.configs import compose_run_config, quiet_libraries
from benchmarks.record import RESULTS_DIR, write_result
from vramkit.core.config.instantiate import instantiate_group
from vramkit.core.io.checkpoint_io import AtomicCheckpointIO
from vramkit.core.oom.resilient_module import OOMResilientModule

TARGET_VRAMKIT_MINUS_LIGHTNING_US = 100.0
TARGET_GUARD_US_PER_PARAM_TENSOR = 0.1
GUARD_SIZES = (4, 100, 600)  # parameter tensors of the guard-alone models
BATCH = 8
FEATURES = 16
WARMUP_STEPS = 20  # first steps of a run left out (allocator, first logs, lazy set-up)


class _Samples(Dataset):
    """Random dict samples, as the project's datamodules give them."""

    def __init__(self, samples: int) -> None:
        generator = torch.Generator().manual_seed(0)
        self.x = torch.randn(samples, FEATURES, generator=generator)
        self.y = torch.randn(samples, 1, generator=generator)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"x": self.x[index], "y": self.y[index]}


class _TinyNet(nn.Module):
    """Linear-ReLU-Linear plus ``param_tensors - 4`` scalars added to the output."""

    def __init__(self, param_tensors: int) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.first = nn.Linear(FEATURES, 32)
        self.second = nn.Linear(32, 1)
        self.extra = nn.ParameterList(
            nn.Parameter(torch.zeros(1)) for _ in range(param_tensors - 4)
        )
        # A plain tuple: iterating the ParameterList costs a microsecond per tensor.
        self._extra_tensors = tuple(self.extra)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.second(F.relu(self.first(x)))
        if self._extra_tensors:
            out = out + torch.cat(self._extra_tensors).sum()
        return out


def _training_step(module: Any, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    loss = F.mse_loss(module.net(batch["x"]), batch["y"])
    module.log("train/loss", loss.detach(), prog_bar=True, batch_size=BATCH)
    return loss


def _optimizers(module: Any) -> dict[str, Any]:
    # foreach: one call for all tensors, so the optimizer's own cost per tensor stays small
    optimizer = torch.optim.SGD(module.parameters(), lr=0.01, foreach=True)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (1 + 1e-3 * step))
    return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}


class LightningTiny(L.LightningModule):
    """The tiny model as a plain LightningModule; ``marks`` holds the CPU time at the start
    of each step."""

    def __init__(self, param_tensors: int = 4) -> None:
        super().__init__()
        self.net = _TinyNet(param_tensors)
        self.marks: list[float] = []

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        # before the guard, which runs inside training_step, so a mark starts a whole step
        self.marks.append(time.process_time())

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        return _training_step(self, batch)

    def configure_optimizers(self) -> dict[str, Any]:
        return _optimizers(self)


class GuardedTiny(OOMResilientModule):
    """The same model and step on vramkit's OOM-resilient base class. With ``alternate``,
    odd steps run unguarded: they are marked as nested in a guarded step."""

    def __init__(self, param_tensors: int = 4, alternate: bool = False) -> None:
        super().__init__()
        self.net = _TinyNet(param_tensors)
        self.marks: list[float] = []
        self.alternate = alternate

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        self.marks.append(time.process_time())
        if self.alternate:
            self.oom_state.depth = batch_idx % 2

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        return _training_step(self, batch)

    def configure_optimizers(self) -> dict[str, Any]:
        return _optimizers(self)


def _loader(steps: int) -> DataLoader:
    return DataLoader(_Samples(steps * BATCH), batch_size=BATCH, shuffle=False)


def step_intervals_us(marks: Sequence[float]) -> list[float]:
    """CPU microseconds from each step's start to the next's, warm-up steps left out."""
    steady = marks[WARMUP_STEPS:]
    if len(steady) < 3:
        raise ValueError(f"{len(marks)} steps leave too few after {WARMUP_STEPS} warm-up steps")
    return [1e6 * (later - earlier) for earlier, later in itertools.pairwise(steady)]


def per_step_us(marks: Sequence[float]) -> float:
    """Mean CPU microseconds per step, warm-up steps left out."""
    return statistics.fmean(step_intervals_us(marks))


def run_plain(steps: int, work: Path) -> float:
    """A bare PyTorch loop over the same loader, optimizer and schedule."""
    module = LightningTiny()
    config = _optimizers(module)
    optimizer, schedule = config["optimizer"], config["lr_scheduler"]["scheduler"]
    for batch in _loader(steps):
        module.marks.append(time.process_time())
        loss = F.mse_loss(module.net(batch["x"]), batch["y"])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
    return per_step_us(module.marks)


def _bare_trainer(steps: int, work: Path, **kwargs: Any) -> L.Trainer:
    settings: dict[str, Any] = {
        "accelerator": "cpu",
        "devices": 1,
        "max_steps": steps,
        "limit_val_batches": 0,
        "num_sanity_val_steps": 0,
        "log_every_n_steps": 10,
        "logger": CSVLogger(work, name="csv"),
        "enable_checkpointing": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "default_root_dir": work,
    }
    return L.Trainer(**{**settings, **kwargs})


def _fit(trainer: L.Trainer, module: Any, steps: int) -> None:
    gc.collect()
    gc.freeze()
    with open(os.devnull, "w") as sink, contextlib.redirect_stdout(sink):
        trainer.fit(module, train_dataloaders=_loader(steps))


def run_lightning(steps: int, work: Path) -> float:
    """The plain LightningModule under a bare Trainer."""
    module = LightningTiny()
    _fit(_bare_trainer(steps, work), module, steps)
    return per_step_us(module.marks)


def default_callbacks(work: Path) -> list[L.Callback]:
    """The callbacks ``train.py`` registers for the default task, from ``conf/callbacks``."""
    cfg = compose_run_config("+hw=cpu", "logger=csv", output_dir=work)
    return instantiate_group(cfg.get("callbacks"))


def run_vramkit(steps: int, work: Path) -> float:
    """The guarded module with vramkit's default callbacks and checkpoint plugin."""
    trainer = _bare_trainer(
        steps,
        work,
        callbacks=default_callbacks(work),
        plugins=[AtomicCheckpointIO()],
        enable_checkpointing=True,
        enable_progress_bar=True,
    )
    module = GuardedTiny()
    _fit(trainer, module, steps)
    return per_step_us(module.marks)


def guard_us(steps: int, work: Path, param_tensors: int) -> float:
    """Mean CPU microseconds a guarded step takes over an unguarded one in the same fit."""
    module = GuardedTiny(param_tensors, alternate=True)
    _fit(_bare_trainer(steps, work), module, steps)
    intervals = step_intervals_us(module.marks)
    # marks[WARMUP_STEPS] starts an even (guarded) step when WARMUP_STEPS is even
    first = WARMUP_STEPS % 2
    guarded, unguarded = intervals[first::2], intervals[1 - first :: 2]
    return statistics.fmean(guarded) - statistics.fmean(unguarded)


def _sides() -> dict[str, Callable[[int, Path], float]]:
    sides: dict[str, Callable[[int, Path], float]] = {
        "plain": run_plain,
        "lightning": run_lightning,
        "vramkit": run_vramkit,
    }
    for size in GUARD_SIZES:
        sides[f"guard_{size}"] = lambda steps, work, size=size: guard_us(steps, work, size)
    return sides


def _summary(values: Sequence[float]) -> dict[str, float]:
    return {
        "median": round(statistics.median(values), 2),
        "min": round(min(values), 2),
        "max": round(max(values), 2),
    }


def run(rounds: int = 11, steps: int = 300) -> dict[str, Any]:
    """``rounds`` rounds of every side in rotating order, ``steps`` steps each."""
    quiet_libraries()
    torch.set_num_threads(1)
    sides = _sides()
    names = list(sides)
    per_round: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*does not have many workers.*")
        warnings.filterwarnings("ignore", message=".*could not find the monitored key.*")
        work = Path(tmp)
        run_plain(WARMUP_STEPS + 3, work)  # untimed: first calls of every path
        for index in range(rounds):
            shift = index % len(names)
            order = names[shift:] + names[:shift]
            if index % 2:
                order.reverse()
            measured = {}
            for name in order:
                measured[name] = sides[name](steps, work / f"{name}_{index}")
            per_round.append(measured)
    sizes = {size: [r[f"guard_{size}"] for r in per_round] for size in GUARD_SIZES}
    first, last = GUARD_SIZES[0], GUARD_SIZES[-1]
    slopes = [
        (high - low) / (last - first) for low, high in zip(sizes[first], sizes[last], strict=True)
    ]
    vramkit_minus_lightning = [r["vramkit"] - r["lightning"] for r in per_round]
    headline = statistics.median(vramkit_minus_lightning)
    slope = statistics.median(slopes)
    return {
        "rounds": rounds,
        "steps": steps,
        "warmup_steps": WARMUP_STEPS,
        "batch": BATCH,
        "step_us": {
            name: _summary([r[name] for r in per_round]) for name in sides if "guard" not in name
        },
        "lightning_minus_plain_us": _summary([r["lightning"] - r["plain"] for r in per_round]),
        "vramkit_minus_lightning_us": round(headline, 2),
        "vramkit_minus_lightning_us_spread": _summary(vramkit_minus_lightning),
        "guard_us": {str(size): _summary(values) for size, values in sizes.items()},
        "guard_us_per_param_tensor": round(slope, 4),
        "guard_us_per_param_tensor_spread": _summary(slopes),
        "target_vramkit_minus_lightning_us": TARGET_VRAMKIT_MINUS_LIGHTNING_US,
        "target_guard_us_per_param_tensor": TARGET_GUARD_US_PER_PARAM_TENSOR,
        "targets_met": headline <= TARGET_VRAMKIT_MINUS_LIGHTNING_US
        and slope <= TARGET_GUARD_US_PER_PARAM_TENSOR,
        "all_rounds": [{name: round(value, 2) for name, value in r.items()} for r in per_round],
        "timing": "CPU microseconds of this process per training step (all threads), mean over "
        f"the steps after the first {WARMUP_STEPS}; vramkit - lightning is paired within a "
        "round; guard_us is a guarded step's mean minus an unguarded one's in the same fit "
        "(steps alternate); medians over rounds with min and max; guard_us_per_param_tensor is "
        f"the median slope of guard_us from {first} to {last} parameter tensors",
    }


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Command line; returns the numbers written."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.step_overhead", description=__doc__)
    parser.add_argument("--rounds", type=int, default=11, help="rounds of every side")
    parser.add_argument("--steps", type=int, default=300, help="training steps per run")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR, help="folder of the JSON file")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    numbers = run(rounds=args.rounds, steps=args.steps)
    path = write_result("step_overhead", numbers, started=started, directory=args.out)
    print(
        f"step overhead: vramkit - Lightning {numbers['vramkit_minus_lightning_us']} us/step "
        f"(target <= {TARGET_VRAMKIT_MINUS_LIGHTNING_US:g}), guard "
        f"{numbers['guard_us_per_param_tensor']} us per parameter tensor (target <= "
        f"{TARGET_GUARD_US_PER_PARAM_TENSOR:g}) -> {path}"
    )
    return numbers


if __name__ == "__main__":
    main()
