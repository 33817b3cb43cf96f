"""What vramkit's safety costs per training step when nothing goes wrong.

A model so small that its compute is negligible (Linear-ReLU-Linear, batch 8, CPU, one
thread) makes every microsecond of framework work visible:

- ``plain``: a PyTorch loop over the same loader (zero_grad, forward, backward, step);
- ``lightning``: a bare Lightning ``Trainer`` (no callbacks, no progress bar, the CSV logger)
  fitting a ``LightningModule`` built like vramkit's (one ``self.log`` per step, a per-step
  learning-rate schedule);
- ``vramkit``: the same module on :class:`~vramkit.core.oom.resilient_module.OOMResilientModule`
  with the callbacks ``train.py`` registers from ``conf/callbacks`` and the atomic checkpoint
  plugin;
- the OOM guard alone, at 4, 100 and 600 parameter tensors (the extra tensors require
  gradients but are not used, so the step's own cost stays small): one fit under the bare
  Trainer whose
  steps alternate between guarded and unguarded (a step marked as nested runs without the
  guard, as a subclass's ``super().training_step`` does).

A step's cost is the CPU time of the measuring process (all its threads: a progress bar's
refresh thread counts) from one step's start to the next's, after a warm-up, so set-up and
the end-of-fit checkpoint do not count. A shared machine's load drifts by tens of percent
within seconds, so nothing is compared across separate moments: ``lightning`` and ``vramkit``
run in two processes on one core that take turns every 10 steps (a fresh pair of processes
and one run of each per round, the mean over its steps), and the guard's cost is the median
difference between adjacent steps of one fit (for the whole of vramkit, a step against the
step at the same place of the next block of 10 steps). Objects alive before a run (the
imports) are frozen out of the garbage collector, whose full passes over them would add tens
of milliseconds at random steps. Each figure is the median over rounds with its spread (min,
max); ``guard_us_per_param_tensor`` is the slope of the guard's cost from 4 to 600 tensors.
``bytecodes_per_step`` counts the Python bytecodes of a step of each side (opcode tracing over
up to 100 steps): the one figure here that load does not move, for telling a change of the
code from a change of the machine.

``python -m benchmarks.step_overhead [--rounds N] [--steps N]`` writes
``results/step_overhead.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import itertools
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import ProgressBar
from lightning.pytorch.loggers import CSVLogger
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, Dataset

from benchmarks.configs import compose_run_config, quiet_libraries
from benchmarks.record import RESULTS_DIR, write_result
from vramkit.core.config.instantiate import instantiate_group
from vramkit.core.io.checkpoint_io import AtomicCheckpointIO
from vramkit.core.oom.resilient_module import OOMResilientModule
from vramkit.core.trainer_assembly.quiet_profiler import quiet_idle_profiler
from vramkit.core.trainer_assembly.working_set import keep_working_callbacks, skip_idle_batch_hooks

TARGET_VRAMKIT_MINUS_LIGHTNING_US = 50.0  # issue 36 (was 100)
TARGET_GUARD_US_PER_PARAM_TENSOR = 0.1
GUARD_SIZES = (4, 100, 600)  # parameter tensors of the guard-alone models
BATCH = 8
FEATURES = 16
WARMUP_STEPS = 20  # first steps of a run left out (allocator, first logs, lazy set-up)
TURN_STEPS = 10  # steps each side of the lockstep pair runs before handing over
LOG_EVERY_N_STEPS = 10  # the Trainers' logging interval, and the in-fit measure's block


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
    """Linear-ReLU-Linear (4 parameter tensors) plus ``param_tensors - 4`` one-element tensors
    that require gradients but take no part in the forward pass: every parameter walk or
    per-parameter hook of the guard covers them, while the step's own cost, and with it the
    noise the guard's cost is read against, grows little with their number."""

    def __init__(self, param_tensors: int) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.first = nn.Linear(FEATURES, 32)
        self.second = nn.Linear(32, 1)
        self.extra = nn.ParameterList(
            nn.Parameter(torch.zeros(1)) for _ in range(param_tensors - 4)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.second(F.relu(self.first(x)))


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
    """The same model and step on vramkit's OOM-resilient base class."""

    def __init__(self, param_tensors: int = 4) -> None:
        super().__init__()
        self.net = _TinyNet(param_tensors)
        self.marks: list[float] = []

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        self.marks.append(time.process_time())

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        return _training_step(self, batch)

    def configure_optimizers(self) -> dict[str, Any]:
        return _optimizers(self)


class AlternatelyGuardedTiny(GuardedTiny):
    """Guards only the blocks of ``block`` steps whose index has the parity
    ``guarded_parity``: the other steps are marked as nested in a guarded step, so the guard
    lets them through."""

    def __init__(self, param_tensors: int, guarded_parity: int, block: int = 1) -> None:
        super().__init__(param_tensors)
        self.guarded_parity = guarded_parity
        self.block = block

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        super().on_train_batch_start(batch, batch_idx)
        self.oom_state.depth = int(batch_idx // self.block % 2 != self.guarded_parity)

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.oom_state.depth = 0


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
        "log_every_n_steps": LOG_EVERY_N_STEPS,
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


class _Lockstep(L.Callback):
    """Takes turns with the other side's process, ``block`` training steps each.

    At the start of every ``block``-th step (but the first) it hands the turn over, then waits
    for it to come back; at the end of the fit it hands it over once more, so the other
    process can finish. Both sides run it, so its own cost (two semaphore calls per block) is
    the same on both. Blocks of several steps keep each process's caches warm within a block,
    as in a run of its own, while the load of any moment still falls on both sides.
    """

    def __init__(self, mine: Any, theirs: Any, block: int = TURN_STEPS) -> None:
        self.mine, self.theirs, self.block = mine, theirs, block
        self._steps = 0

    def on_train_start(self, *_: Any) -> None:
        self._steps = 0

    def on_train_batch_start(self, *_: Any) -> None:
        if self._steps % self.block == 0:
            if self._steps:
                self.theirs.release()
            self.mine.acquire()
        self._steps += 1

    def on_train_end(self, *_: Any) -> None:
        self.theirs.release()


def run_lightning(steps: int, work: Path, lockstep: _Lockstep) -> float:
    """The plain LightningModule under a bare Trainer."""
    trainer = _bare_trainer(steps, work, callbacks=[lockstep])
    skip_idle_batch_hooks(lockstep)
    module = LightningTiny()
    _fit(trainer, module, steps)
    return per_step_us(module.marks)


def default_callbacks(work: Path) -> list[L.Callback]:
    """The callbacks ``train.py`` registers for the default task, from ``conf/callbacks``."""
    cfg = compose_run_config("+hw=cpu", "logger=csv", output_dir=work)
    return instantiate_group(cfg.get("callbacks"))


def _vramkit_trainer(steps: int, work: Path) -> L.Trainer:
    """A Trainer with vramkit's default callbacks and checkpoint plugin, as train.py builds it."""
    trainer = _bare_trainer(
        steps,
        work,
        callbacks=default_callbacks(work),
        plugins=[AtomicCheckpointIO()],
        enable_checkpointing=True,
        enable_progress_bar=True,
    )
    keep_working_callbacks(trainer)  # as train.py does
    return trainer


def run_vramkit(steps: int, work: Path, lockstep: _Lockstep) -> float:
    """The guarded module with vramkit's default callbacks and checkpoint plugin."""
    trainer = _vramkit_trainer(steps, work)
    trainer.callbacks.append(lockstep)
    skip_idle_batch_hooks(lockstep)
    module = GuardedTiny()
    _fit(trainer, module, steps)
    return per_step_us(module.marks)


def _side_process(
    side: str, rounds: int, steps: int, work: Path, turns: tuple[Any, Any], results: Any
) -> None:
    if hasattr(os, "sched_setaffinity"):
        # Both sides on the same core: a core shared with a busy neighbour slows only one
        # side otherwise, by a fixed amount for the whole run.
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    mine, theirs = turns if side == "lightning" else turns[::-1]
    lockstep = _Lockstep(mine, theirs)
    runner = run_lightning if side == "lightning" else run_vramkit
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*does not have many workers.*")
        warnings.filterwarnings("ignore", message=".*could not find the monitored key.*")
        costs = [runner(steps, work / f"{side}_{index}", lockstep) for index in range(rounds)]
    results.put((side, costs))


def lockstep_pair(rounds: int, steps: int, work: Path) -> dict[str, list[float]]:
    """Per-step CPU microseconds of ``lightning`` and ``vramkit``, one list entry per round.

    Each side runs in a process of its own (forked from this one, so nothing is imported
    twice), both on the same core, and the two take turns every ``TURN_STEPS`` steps: whatever
    load the machine carries at a given moment falls on both alike, which separate runs a
    second apart do not ensure.
    """
    context = multiprocessing.get_context("fork")
    turns = (context.Semaphore(1), context.Semaphore(0))
    results = context.Queue()
    processes = [
        context.Process(target=_side_process, args=(side, rounds, steps, work, turns, results))
        for side in ("lightning", "vramkit")
    ]
    for process in processes:
        process.start()
    measured = dict(results.get() for _ in processes)
    for process in processes:
        process.join()
        if process.exitcode:
            raise RuntimeError(f"a lockstep side failed with exit code {process.exitcode}")
    return measured


class _OpcodeCounter(L.Callback):
    """Counts the Python bytecodes the process runs from the start of step ``first`` to the
    start of step ``last`` (``sys.settrace`` with opcode events: slow, but the same count on a
    busy machine as on a quiet one)."""

    def __init__(self, first: int, last: int) -> None:
        self.first, self.last = first, last
        self.count = 0

    def _local(self, frame: Any, event: str, arg: Any) -> Any:
        if event == "opcode":
            self.count += 1
        return self._local

    def _global(self, frame: Any, event: str, arg: Any) -> Any:
        frame.f_trace_opcodes = True
        return self._local

    def on_train_batch_start(self, trainer: L.Trainer, *_: Any) -> None:
        if trainer.global_step == self.first:
            sys.settrace(self._global)
        elif trainer.global_step == self.last:
            sys.settrace(None)


def traced_bytecodes_per_step(
    side: str, work: Path, first: int, last: int, param_tensors: int = 4
) -> int:
    """Python bytecodes per training step of ``side`` ("lightning", "vramkit", or
    "lightning_quiet_profiler": bare Lightning with vramkit's no-op profiler) on a model of
    ``param_tensors`` parameter tensors, counted from step ``first`` to step ``last``: a figure
    that load does not move, beside the timings that it does. It leaves out C work (tensor
    ops, dict lookups inside one bytecode)."""
    counter = _OpcodeCounter(first, last)
    if side in ("lightning", "lightning_quiet_profiler"):
        trainer = _bare_trainer(last + 5, work, callbacks=[counter])
        if side == "lightning_quiet_profiler":
            quiet_idle_profiler(trainer)
        module: L.LightningModule = LightningTiny(param_tensors)
    else:
        trainer, module = _vramkit_trainer(last + 5, work), GuardedTiny(param_tensors)
        trainer.callbacks.insert(0, counter)
    _fit(trainer, module, last + 5)
    return round(counter.count / (last - first))


class _StepStart(L.Callback):
    """Stamps the CPU time at the start of each training step, before any other callback's
    hook of that step (register it first)."""

    def __init__(self) -> None:
        self.marks: list[float] = []

    def on_train_batch_start(self, *_: Any) -> None:
        self.marks.append(time.process_time())


class _SwapCallbacks(L.Callback):
    """At the end of each step (register it last), gives the next step vramkit's callbacks if
    its block of ``LOG_EVERY_N_STEPS`` steps has the parity ``on_parity``, else none but the two
    timing callbacks and the progress bar (Rich's columns read it from
    ``trainer.progress_bar_callback`` whenever the bar redraws; off a terminal its batch hooks
    are off anyway)."""

    def __init__(self, stamp: _StepStart, vramkit: list[L.Callback], on_parity: int) -> None:
        self.on = [stamp, *vramkit, self]
        bars = [callback for callback in vramkit if isinstance(callback, ProgressBar)]
        self.off = [stamp, *bars, self]
        self.on_parity = on_parity

    def on_train_batch_end(self, trainer: L.Trainer, *_: Any) -> None:
        next_block = trainer.global_step // LOG_EVERY_N_STEPS
        trainer.callbacks = self.on if next_block % 2 == self.on_parity else self.off


def in_fit_us(steps: int, work: Path, on_parity: int) -> float:
    """CPU microseconds a step with vramkit's guard and callbacks takes over one without them
    in the same fit: blocks of ``LOG_EVERY_N_STEPS`` steps alternate between the two, and the figure
    is the median difference between a step and the step at the same place of the next block. One
    process, so what a process's memory layout adds to all its steps cancels out, unlike
    between the two processes of the lockstep pair; what a process does beside its steps (a
    progress bar's thread) does not count here. A block is as long as the logging interval
    (``log_every_n_steps``), so a logging step is paired with a logging step: alternating
    single steps put every logging step on one side (the medians of the two parities read
    -19 and +78 us over 16 rounds)."""
    trainer = _vramkit_trainer(steps, work)
    stamp = _StepStart()
    swap = _SwapCallbacks(stamp, list(trainer.callbacks), on_parity)
    for callback in (stamp, swap):
        skip_idle_batch_hooks(callback)
    trainer.callbacks = swap.on  # every callback sets up; blocks alternate from the first
    block = LOG_EVERY_N_STEPS
    _fit(trainer, AlternatelyGuardedTiny(4, on_parity, block=block), steps)
    return alternate_steps_difference_us(stamp.marks, on_parity, block=block)


def guard_us(steps: int, work: Path, param_tensors: int, guarded_parity: int) -> float:
    """CPU microseconds a guarded step takes over an unguarded one in the same fit: the
    median over the step pairs (a guarded step and the unguarded one after it). Steps of one
    parity run a little faster than the other's whatever they run, so rounds alternate the
    guarded parity and the median over rounds lies between the two."""
    module = AlternatelyGuardedTiny(param_tensors, guarded_parity)
    _fit(_bare_trainer(steps, work), module, steps)
    return alternate_steps_difference_us(module.marks, guarded_parity)


def alternate_steps_difference_us(marks: Sequence[float], on_parity: int, block: int = 1) -> float:
    """The median, over the steps of every block of ``block`` steps with parity ``on_parity``,
    of a step's time minus that of the step at the same place in the next block (CPU
    microseconds), warm-up steps and incomplete blocks left out; ``block=1`` pairs adjacent
    steps. A median over steps, not over block means: a block's mean moves with the load of
    its moment (10 steps last about 30 ms), a median of step pairs much less."""
    intervals = step_intervals_us(marks)  # intervals[i] is step WARMUP_STEPS + i
    skip = -WARMUP_STEPS % block  # steps before the first whole block
    blocks = [
        intervals[start : start + block] for start in range(skip, len(intervals) - block + 1, block)
    ]
    first = ((WARMUP_STEPS + skip) // block - on_parity) % 2  # first block of parity on_parity
    pairs = list(zip(blocks[first::2], blocks[first + 1 :: 2], strict=False))
    if not pairs:
        raise ValueError(f"{len(marks)} steps hold no pair of {block}-step blocks after warm-up")
    return statistics.median(a - b for on, off in pairs for a, b in zip(on, off, strict=True))


def _summary(values: Sequence[float]) -> dict[str, float]:
    return {
        "median": round(statistics.median(values), 2),
        "min": round(min(values), 2),
        "max": round(max(values), 2),
    }


def run(rounds: int = 16, steps: int = 300) -> dict[str, Any]:
    """``rounds`` rounds of every measurement, ``steps`` training steps each."""
    quiet_libraries()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*does not have many workers.*")
        work = Path(tmp)
        run_plain(WARMUP_STEPS + 3, work)  # untimed: first calls of every path
        default_callbacks(work / "settled")  # settled once here: the forked sides inherit it
        # A fresh pair of processes each round: a process's memory layout makes all its steps
        # a few percent faster or slower for its whole life, and one pair for every round
        # gave medians from 56 to 162 us between invocations of the same code.
        pair: dict[str, list[float]] = {"lightning": [], "vramkit": []}
        for index in range(rounds):
            for side, values in lockstep_pair(1, steps, work / f"pair_{index}").items():
                pair[side].extend(values)
        in_fit = [
            in_fit_us(steps, work / f"in_fit_{index}", on_parity=index % 2)
            for index in range(rounds)
        ]
        traced = {
            size: {
                side: traced_bytecodes_per_step(
                    side,
                    work / f"traced_{side}_{size}",
                    WARMUP_STEPS,
                    min(steps, WARMUP_STEPS + 100),
                    param_tensors=size,
                )
                for side in ("lightning", "vramkit")
            }
            for size in (GUARD_SIZES[0], GUARD_SIZES[-1])
        }
        bytecodes = traced[GUARD_SIZES[0]]
        quiet_lightning = traced_bytecodes_per_step(
            "lightning_quiet_profiler",
            work / "traced_quiet",
            WARMUP_STEPS,
            min(steps, WARMUP_STEPS + 100),
        )
        plain: list[float] = []
        sizes: dict[int, list[float]] = {size: [] for size in GUARD_SIZES}
        for index in range(rounds):
            order = list(GUARD_SIZES) if index % 2 == 0 else list(reversed(GUARD_SIZES))
            for size in order:
                folder = work / f"guard_{size}_{index}"
                sizes[size].append(guard_us(steps, folder, size, guarded_parity=index % 2))
            plain.append(run_plain(steps, work))
    first, last = GUARD_SIZES[0], GUARD_SIZES[-1]
    slopes = [
        (high - low) / (last - first) for low, high in zip(sizes[first], sizes[last], strict=True)
    ]
    vramkit_minus_lightning = [
        mine - theirs for mine, theirs in zip(pair["vramkit"], pair["lightning"], strict=True)
    ]
    headline = statistics.median(vramkit_minus_lightning)
    percent = [
        100.0 * (mine / theirs - 1.0)
        for mine, theirs in zip(pair["vramkit"], pair["lightning"], strict=True)
    ]
    slope = statistics.median(slopes)
    return {
        "rounds": rounds,
        "steps": steps,
        "warmup_steps": WARMUP_STEPS,
        "batch": BATCH,
        "step_us": {
            "plain": _summary(plain),
            "lightning": _summary(pair["lightning"]),
            "vramkit": _summary(pair["vramkit"]),
        },
        "vramkit_minus_lightning_us": round(headline, 2),
        "vramkit_minus_lightning_in_fit_us": _summary(in_fit),
        "bytecodes_per_step": bytecodes,
        "vramkit_minus_lightning_bytecodes": bytecodes["vramkit"] - bytecodes["lightning"],
        # The no-op profiler's share, measured on both sides: bare Lightning pays it for
        # every profiled hook call, vramkit swaps in a cheaper one (quiet_profiler.py); against
        # Lightning with that same profiler, what vramkit's own work (guard, callbacks) costs.
        "lightning_quiet_profiler_bytecodes": quiet_lightning,
        "noop_profiler_bytecodes_saved": bytecodes["lightning"] - quiet_lightning,
        "vramkit_own_bytecodes": bytecodes["vramkit"] - quiet_lightning,
        # flat in model size: vramkit's extra bytecodes on the largest model against the smallest
        "vramkit_minus_lightning_bytecodes_by_param_tensors": {
            str(size): sides["vramkit"] - sides["lightning"] for size, sides in traced.items()
        },
        "vramkit_minus_lightning_us_spread": _summary(vramkit_minus_lightning),
        "vramkit_minus_lightning_percent": _summary(percent),
        "guard_us": {str(size): _summary(values) for size, values in sizes.items()},
        "guard_us_per_param_tensor": round(slope, 4),
        "guard_us_per_param_tensor_spread": _summary(slopes),
        "target_vramkit_minus_lightning_us": TARGET_VRAMKIT_MINUS_LIGHTNING_US,
        "target_guard_us_per_param_tensor": TARGET_GUARD_US_PER_PARAM_TENSOR,
        "targets_met": headline <= TARGET_VRAMKIT_MINUS_LIGHTNING_US
        and slope <= TARGET_GUARD_US_PER_PARAM_TENSOR,
        "all_rounds": {
            "plain": [round(v, 2) for v in plain],
            **{side: [round(v, 2) for v in values] for side, values in pair.items()},
            "in_fit": [round(v, 2) for v in in_fit],
            **{f"guard_{size}": [round(v, 2) for v in values] for size, values in sizes.items()},
        },
        "timing": "CPU microseconds of the measuring process per training step (all its "
        f"threads), after the first {WARMUP_STEPS} steps of a run; lightning and vramkit: the "
        "mean over a run's steps, the two sides in separate processes on one core taking "
        f"turns every {TURN_STEPS} steps, a fresh pair and one run each per round; guard_us: "
        "the median over a fit's step pairs of a guarded step's time minus the next, unguarded, "
        "step's; medians over rounds with min and max; guard_us_per_param_tensor: the median "
        f"slope of guard_us from {first} to {last} parameter tensors; plain: measured on its "
        "own, paired with nothing; bytecodes_per_step: Python bytecodes per step, traced over "
        "up to 100 steps after the warm-up (vramkit_minus_lightning_bytecodes_by_param_tensors: "
        f"the same on models of {first} and {last} parameter tensors; "
        "lightning_quiet_profiler_bytecodes: bare Lightning with vramkit's no-op profiler, "
        "vramkit_own_bytecodes: vramkit minus that); "
        "vramkit_minus_lightning_in_fit_us: in one fit, "
        f"blocks of {LOG_EVERY_N_STEPS} steps with vramkit's guard and callbacks and without them "
        "alternate, the median over steps of a step's time minus the step's at the same place "
        "of the next block, one fit per round; vramkit_minus_lightning_percent: the pair's "
        "difference in percent of the Lightning side's step, per round",
    }


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Command line; returns the numbers written."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.step_overhead", description=__doc__)
    parser.add_argument(
        "--rounds", type=int, default=16, help="rounds of every measurement (even: see guard_us)"
    )
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
