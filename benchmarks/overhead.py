"""What vramkit costs on top of bare Lightning, and both on top of a plain PyTorch loop: same
model, data and steps.

All sides get the objects ``train.py`` builds from the same config, the default task's (a
quarter-width DBNet, 256 px crops of synthetic images, batch 16, the CPU profile, one loader
worker) on a smaller rendered set, and run the same number of optimizer steps without
validation:

- ``vramkit``: the Lightning Trainer from ``conf/trainer/default.yaml`` with the default
  callbacks ``train.py`` registers (those with work in this run: checkpoints, retention,
  learning-rate monitor, bad-input report, throughput monitor, rich progress bar, memory
  monitor and hygiene) and the CSV logger. The WandB logger is left out: it starts a service
  process once per run, a fixed cost of seconds that does not grow with the run's length.
- ``lightning``: the same network, loss, optimizer and schedule in a bare ``LightningModule``
  (:class:`BareLightningModule`) fitted by a Lightning ``Trainer`` with nothing switched on (no
  callbacks, logger, checkpoints, progress bar or summary).
- ``plain``: ``for batch in loader: loss.backward(); optimizer.step(); scheduler.step()``.

The three take turns (each first, second and third equally often) so drifting load hits all
alike. Times are CPU seconds of this process (all its threads; the loader worker is left out,
it does the same work for all), which a machine shared with other jobs disturbs far less than
the wall clock. The headline ``overhead_pct`` is what issue #36 bounds, vramkit over bare
Lightning: the median over repeats of the back-to-back runs' difference (a best-of pairs the
luckiest run of each side, which need not have met the same load). The same against the plain
loop (``overhead_over_plain_loop_pct``, the headline until 2026-11-29) also counts Lightning's
own cost per step (its closure, hooks and result collection: about 10 ms of a 500 ms step here),
which no vramkit change can remove. Best-of, per-side medians, steady-state steps and wall-clock
numbers are recorded too.

Each side's minor page faults per steady step are recorded beside its step time: a DBNet step
on the CPU allocates and frees a few hundred MB through glibc's heap, and whenever glibc hands
the heap's free top back to the kernel the next step faults it in again, about 2 µs a 4 KiB
page. How often that happens follows the order of the step's frees, not their Python: while
the OOM guard zeroed the gradients before the forward instead of after it, the vramkit side
took a median 30k faults a step against the plain loop's 8k, 50 ms of a 700 ms step. Runs of
the same code differ too (per-run medians 3k to 33k a step): most of this benchmark's noise.

``python -m benchmarks.overhead [--repeats N] [--epochs N]`` writes ``results/overhead.json``.
"""

from __future__ import annotations

import argparse
import itertools
import math
import resource
import statistics
import tempfile
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lightning as L
import torch
from omegaconf import DictConfig

from benchmarks.configs import compose_run_config, quiet_libraries
from benchmarks.record import RESULTS_DIR, write_result
from vramkit.core.config.instantiate import instantiate, instantiate_group
from vramkit.core.trainer_assembly.working_set import keep_working_callbacks
from vramkit.tasks.text_detection.data.device_inputs import to_model_inputs

TARGET_OVERHEAD_PCT = 5.0
OVERRIDES = (
    "+hw=cpu",
    "logger=csv",
    "data.synthetic.num_train=240",  # 15 steps per epoch at the default batch of 16
    "data.synthetic.num_val=1",
    "+trainer.limit_val_batches=0",
    "seed=0",
)


def _built(cfg: DictConfig) -> tuple[Any, Any]:
    """The datamodule (set up) and the model, as ``train()`` builds them."""
    L.seed_everything(cfg.seed, workers=True, verbose=False)
    datamodule = instantiate(cfg.data)
    datamodule.prepare_data()
    datamodule.setup("fit")
    return datamodule, instantiate(cfg.model)


def steady_step_seconds(marks: Sequence[float]) -> float:
    """Median CPU seconds from one step's start to the next's, the first 3 steps left out
    (start-up), so a run's fixed costs (set-up, checkpoints at epoch ends) do not count."""
    intervals = [later - earlier for earlier, later in itertools.pairwise(marks[3:])]
    return statistics.median(intervals) if intervals else float("nan")


# The steps run on the main thread; the loader worker, another process, is not counted.
_FAULTS_OF = getattr(resource, "RUSAGE_THREAD", resource.RUSAGE_SELF)


def minor_faults() -> int:
    """Minor page faults of this thread so far (of the process where threads are not told
    apart): pages the kernel mapped in on first touch, without reading a disk."""
    return resource.getrusage(_FAULTS_OF).ru_minflt


def steady_step_faults(faults: Sequence[int]) -> float:
    """Median minor page faults from one step's start to the next's, the first 3 steps left
    out, as :func:`steady_step_seconds` does with the step times."""
    steps = [later - earlier for earlier, later in itertools.pairwise(faults[3:])]
    return statistics.median(steps) if steps else float("nan")


class StepStartMarks(L.Callback):
    """Process CPU time and minor page faults at the start of every training batch, and the CPU
    time when training ends (before the fit's closing work: the callbacks' ``on_fit_end``, the
    report among them)."""

    def __init__(self) -> None:
        self.marks: list[float] = []
        self.faults: list[int] = []
        self.train_end = math.nan

    def on_train_batch_start(self, *args: Any) -> None:
        self.marks.append(time.process_time())
        self.faults.append(minor_faults())

    def on_train_end(self, *args: Any) -> None:
        self.train_end = time.process_time()


def fit_phases(start: float, marks: Sequence[float], train_end: float, end: float) -> dict:
    """A run's CPU seconds split where it spends them: ``setup_seconds`` (the start to the first
    step), ``steps_seconds`` (the first step's start to the end of training, epoch ends and
    checkpoints included) and ``closing_seconds`` (the end of training to the end of the run:
    the report, summaries)."""
    first = marks[0] if marks else train_end
    return {
        "setup_seconds": first - start,
        "steps_seconds": train_end - first,
        "closing_seconds": end - train_end,
    }


def run_vramkit(cfg: DictConfig) -> dict[str, float]:
    """``trainer.fit`` with the default callbacks; CPU and wall seconds, optimizer steps."""
    datamodule, model = _built(cfg)
    marks = StepStartMarks()
    callbacks = [*instantiate_group(cfg.get("callbacks")), marks]
    loggers = instantiate_group(cfg.get("logger"))
    trainer: L.Trainer = instantiate(cfg.trainer, callbacks=callbacks, logger=loggers or False)
    keep_working_callbacks(trainer, datamodule)  # as train.py does
    return timed_fit(trainer, model, datamodule, marks)


def timed_fit(
    trainer: L.Trainer, model: L.LightningModule, datamodule: Any, marks: StepStartMarks
) -> dict[str, float]:
    """``trainer.fit(model)``: CPU and wall seconds, optimizer steps, steady steps and phases
    (``marks`` is one of the trainer's callbacks)."""
    start, wall = time.process_time(), time.perf_counter()
    trainer.fit(model, datamodule=datamodule)
    end, wall = time.process_time(), time.perf_counter() - wall
    return {
        "cpu_seconds": end - start,
        "wall_seconds": wall,
        "steps": trainer.global_step,
        "steady_step_seconds": steady_step_seconds(marks.marks),
        "steady_step_faults": steady_step_faults(marks.faults),
        **fit_phases(start, marks.marks, marks.train_end, end),
    }


def run_plain(cfg: DictConfig, *, max_steps: int | None = None) -> dict[str, float]:
    """The same model, loader, optimizer and schedule in a bare loop (no validation)."""
    datamodule, module = _built(cfg)
    net, loss_fn = module.net, module.loss
    loader = datamodule.train_dataloader()
    epochs = int(cfg.trainer.max_epochs)
    total = epochs * len(loader) if max_steps is None else max_steps
    optimizer = module.optimizer_factory(params=module.parameters())
    scheduler = module.lr_schedule.build(optimizer, total)
    net.train()
    steps = 0
    marks, faults = [], []
    start, wall = time.process_time(), time.perf_counter()
    for _ in range(epochs):
        for batch in loader:
            if steps == total:
                break
            marks.append(time.process_time())
            faults.append(minor_faults())
            batch = to_model_inputs(batch, channels_last=datamodule.settings.channels_last)
            losses = loss_fn(net(batch["image"]), batch)
            optimizer.zero_grad(set_to_none=True)
            losses["loss"].backward()
            optimizer.step()
            scheduler.step()
            steps += 1
    train_end = time.process_time()
    end, wall = time.process_time(), time.perf_counter() - wall
    return {
        "cpu_seconds": end - start,
        "wall_seconds": wall,
        "steps": steps,
        "steady_step_seconds": steady_step_seconds(marks),
        "steady_step_faults": steady_step_faults(faults),
        **fit_phases(start, marks, train_end, end),
    }


class BareLightningModule(L.LightningModule):
    """The task module's network, loss, optimizer and schedule, and nothing of vramkit's: no OOM
    guard, no logging."""

    def __init__(self, module: Any) -> None:
        super().__init__()
        self.net, self.loss = module.net, module.loss
        self.optimizer_factory, self.lr_schedule = module.optimizer_factory, module.lr_schedule

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        return self.loss(self.net(batch["image"]), batch)["loss"]

    def configure_optimizers(self) -> dict[str, Any]:
        optimizer = self.optimizer_factory(params=self.parameters())
        return self.lr_schedule.lightning_config(
            optimizer, int(self.trainer.estimated_stepping_batches)
        )


def run_lightning(cfg: DictConfig) -> dict[str, float]:
    """``trainer.fit`` of :class:`BareLightningModule` in a Lightning ``Trainer`` with nothing
    switched on: no callbacks, logger, checkpoints, progress bar or summary; the datamodule's
    own batch conversion."""
    datamodule, module = _built(cfg)
    marks = StepStartMarks()
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        precision=cfg.trainer.precision,
        max_epochs=int(cfg.trainer.max_epochs),
        limit_val_batches=0,
        num_sanity_val_steps=0,
        callbacks=[marks],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=cfg.trainer.default_root_dir,
    )
    return timed_fit(trainer, BareLightningModule(module), datamodule, marks)


SIDES = {"plain": run_plain, "lightning": run_lightning, "vramkit": run_vramkit}
"""Each side's runner: a plain loop, bare Lightning, vramkit's Trainer and callbacks."""


def _pct(vramkit: float, plain: float) -> float:
    return round(100.0 * (vramkit - plain) / plain, 2)


def _paired(results: dict[str, list[dict[str, float]]], mine: str, theirs: str, key: str) -> list:
    """Each repeat's ``mine`` minus ``theirs`` run: (difference in %, in seconds)."""
    return [
        (100.0 * (a[key] - b[key]) / b[key], a[key] - b[key])
        for a, b in zip(results[mine], results[theirs], strict=True)
    ]


def run(repeats: int = 6, epochs: int = 2, extra_overrides: Sequence[str] = ()) -> dict:
    """Run the three sides ``repeats`` times each, taking turns; the overheads in %, paired
    medians first."""
    quiet_libraries()
    torch.set_num_threads(1)  # one core computes, the other loads (the CPU profile's split)
    results: dict[str, list[dict[str, float]]] = {side: [] for side in SIDES}
    with tempfile.TemporaryDirectory() as work, warnings.catch_warnings():
        # Without validation, ModelCheckpoint warns that val/hmean was never logged.
        warnings.filterwarnings("ignore", message=".*could not find the monitored key.*")
        warnings.filterwarnings("ignore", message=".*does not have many workers.*")
        # The bare Lightning side has no validation_step by design (nothing validates here).
        warnings.filterwarnings(
            "ignore", message=".*`val_dataloader` but have no `validation_step`"
        )
        cfg = compose_run_config(
            *OVERRIDES, f"trainer.max_epochs={epochs}", *extra_overrides, output_dir=Path(work)
        )
        run_plain(cfg, max_steps=2)  # untimed: renders the data, warms up every code path
        names = list(SIDES)
        for repeat in range(repeats):
            # each side takes each place in the order equally often: drifting load hits all
            for side in names[repeat % len(names) :] + names[: repeat % len(names)]:
                cfg = compose_run_config(
                    *OVERRIDES,
                    f"trainer.max_epochs={epochs}",
                    *extra_overrides,
                    output_dir=Path(work) / f"{side}_{repeat}",
                )
                results[side].append(SIDES[side](cfg))
    steps = {side: {int(r["steps"]) for r in runs} for side, runs in results.items()}
    if len(set().union(*steps.values())) != 1:
        raise AssertionError(f"the sides ran different numbers of steps: {steps}")
    (step_count,) = steps["plain"]
    summary = {
        side: {
            f"{stat}_{key}": function(r[key] for r in runs)
            for key in ("cpu_seconds", "wall_seconds")
            for stat, function in (("best", min), ("median", statistics.median))
        }
        for side, runs in results.items()
    }
    steady = {
        side: statistics.median(r["steady_step_seconds"] for r in results[side]) for side in SIDES
    }

    def paired_pct(mine: str, theirs: str, key: str = "cpu_seconds") -> float:
        return round(statistics.median(pct for pct, _ in _paired(results, mine, theirs, key)), 2)

    def paired_ms_per_step(mine: str, theirs: str) -> float:
        seconds = statistics.median(d for _, d in _paired(results, mine, theirs, "cpu_seconds"))
        return round(1000 * seconds / step_count, 1)

    def phases(mine: str, theirs: str) -> dict[str, float]:
        return {
            phase: round(statistics.median(d for _, d in _paired(results, mine, theirs, phase)), 3)
            for phase in ("setup_seconds", "steps_seconds", "closing_seconds")
        }

    plain, lightning, vramkit = (summary[side] for side in SIDES)
    return {
        "steps": step_count,
        "epochs": epochs,
        "repeats": repeats,
        "overrides": list(OVERRIDES) + list(extra_overrides),
        # headline (#36's target, "over plain Lightning"): each repeat's runs ran back to back,
        # so their difference cancels slow drifts of the load; the median over repeats
        "overhead_pct": paired_pct("vramkit", "lightning"),
        "overhead_ms_per_step": paired_ms_per_step("vramkit", "lightning"),
        "overhead_pct_best": _pct(vramkit["best_cpu_seconds"], lightning["best_cpu_seconds"]),
        "overhead_pct_wall": paired_pct("vramkit", "lightning", "wall_seconds"),
        # the same against a plain PyTorch loop: Lightning's own cost counted too
        "overhead_over_plain_loop_pct": paired_pct("vramkit", "plain"),
        "overhead_over_plain_loop_ms_per_step": paired_ms_per_step("vramkit", "plain"),
        "lightning_over_plain_loop_pct": paired_pct("lightning", "plain"),
        **{f"{side}_seconds": round(summary[side]["median_cpu_seconds"], 3) for side in SIDES},
        **{
            f"{side}_wall_seconds": round(summary[side]["median_wall_seconds"], 3) for side in SIDES
        },
        # steady state: per-step costs only, each side's median step over its repeats
        **{f"steady_step_ms_{side}": round(1000 * steady[side], 1) for side in SIDES},
        "steady_step_overhead_pct": _pct(steady["vramkit"], steady["lightning"]),
        "steady_step_overhead_over_plain_loop_pct": _pct(steady["vramkit"], steady["plain"]),
        # minor page faults per steady step, each side's median over its repeats
        **{
            f"steady_step_faults_{side}": round(
                statistics.median(r["steady_step_faults"] for r in results[side]), 1
            )
            for side in SIDES
        },
        "plain_spread_pct": _pct(
            max(r["cpu_seconds"] for r in results["plain"]), plain["best_cpu_seconds"]
        ),
        # where the difference sits: per phase, the median over repeats of the paired runs'
        # difference in CPU seconds (fit_phases)
        "phase_overhead_seconds": phases("vramkit", "lightning"),
        "phase_overhead_over_plain_loop_seconds": phases("vramkit", "plain"),
        "target_overhead_pct": TARGET_OVERHEAD_PCT,
        "all_runs": {
            side: [{key: round(value, 3) for key, value in r.items()} for r in runs]
            for side, runs in results.items()
        },
        "timing": "CPU seconds of this process (all threads; the loader worker excluded). "
        "overhead_pct (the headline), overhead_ms_per_step, overhead_pct_wall: median over "
        "repeats of the back-to-back runs' difference, vramkit against bare Lightning; "
        "*_over_plain_loop_*: the same against the plain loop; overhead_pct_best: best run of "
        "each side (as timeit); *_seconds: each side's median run; plain_spread_pct: how much "
        "the plain loop's slowest run took over its fastest (the noise floor); steady_step_* "
        "compare median step times after the first 3 steps (per-step costs without the fixed "
        "ones); steady_step_faults_*: minor page faults of the main thread per such step; "
        "phase_overhead_seconds: the paired difference per phase of a run (setup: start to the "
        "first step; steps: first step to the end of training, epoch ends and checkpoints "
        "included; closing: the end of training to the end of the run, where vramkit writes its "
        "report)",
    }


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Command line; returns the numbers written."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.overhead", description=__doc__)
    parser.add_argument("--repeats", type=int, default=6, help="runs of each side")
    parser.add_argument("--epochs", type=int, default=2, help="epochs of each run")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR, help="folder of the JSON file")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    numbers = run(repeats=args.repeats, epochs=args.epochs)
    path = write_result("overhead", numbers, started=started, directory=args.out)
    print(
        f"overhead: vramkit {numbers['vramkit_seconds']} s vs bare Lightning "
        f"{numbers['lightning_seconds']} s vs a plain loop {numbers['plain_seconds']} s (medians) "
        f"over {numbers['steps']} steps: {numbers['overhead_pct']}% over Lightning, paired median "
        f"(best-of {numbers['overhead_pct_best']}%, wall {numbers['overhead_pct_wall']}%); "
        f"{numbers['overhead_over_plain_loop_pct']}% over the plain loop -> {path}"
    )
    return numbers


if __name__ == "__main__":
    main()
