"""Training and validation throughput, step-time percentiles, data wait and MFU under ``perf/``.

Lightning's own ``ThroughputMonitor`` synchronises CUDA after every batch, takes peak FLOPs from
its own device table rather than the hardware profile, expects the module to provide
``flops_per_batch``, and reports neither step-time percentiles nor the time spent waiting for
data. This callback keeps Lightning's definitions (samples per second over the training time,
validation time kept apart from training time, MFU = achieved FLOP/s ÷ peak FLOP/s per device)
and measures without per-step synchronisation: on a GPU every mark is a CUDA event read back
only once it has completed, on a CPU it is ``time.perf_counter``.

Metrics, logged to every logger:

- ``perf/train_samples_per_s``: training samples per second (all devices), data wait included;
- ``perf/train_step_ms_median``, ``perf/train_step_ms_p90``: time from the end of one training
  step to the end of the next (ms);
- ``perf/data_wait_fraction``: share of that time spent between steps: waiting for the loader,
  copying the batch to the device, and the work of other callbacks;
- ``perf/mfu``: model FLOPs utilisation against the profile's peak TFLOPS for the run's precision;
- ``perf/val_samples_per_s``: validation samples per second, the whole validation pass included;
- ``perf/val_train_time_ratio``: time per validation sample ÷ time per training sample.

Training metrics are logged every ``log_every_n_steps`` steps (over those steps) and at the end
of each epoch; validation metrics after each validation pass. A summary table over the whole
run is logged at the end of fitting.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import lightning as L
import torch
from lightning.pytorch.trainer.states import TrainerFn
from pydantic import Field
from torch.utils.flop_counter import FlopCounterMode

from vramkit.core.compat import lightning_private, torch_private
from vramkit.core.config.settings import Settings
from vramkit.core.data.batches import batch_size_of
from vramkit.core.tables import render_table

log = logging.getLogger(__name__)

_MAX_FLOP_ATTEMPTS = 3  # training steps tried for a FLOP count (batches may be empty)

_PEAK_FIELD_BY_PRECISION = {
    "16-mixed": "fp16",
    "16-true": "fp16",
    "16": "fp16",
    "bf16-mixed": "bf16",
    "bf16-true": "bf16",
    "bf16": "bf16",
    "32-true": "fp32",
    "32": "fp32",
}


def peak_tflops_for_precision(precision: str, peaks: Mapping[str, float | None]) -> float | None:
    """The peak TFLOPS (per device) that matches a Lightning precision string.

    ``peaks`` maps "fp16", "bf16" and "fp32" to the profile's numbers (None where unknown);
    precisions without a peak in the profiles (64-true, fp8 plugins) give None.
    """
    field = _PEAK_FIELD_BY_PRECISION.get(str(precision))
    return None if field is None else peaks.get(field)


class StepClock(Protocol):
    """Marks points in time and reads the seconds between two marks once both are complete."""

    def mark(self) -> Any: ...

    def ready(self, mark: Any) -> bool: ...

    def seconds(self, start: Any, end: Any) -> float: ...


class WallClock:
    """``time.perf_counter`` marks: for CPU runs, where work is done when the call returns."""

    # The C function itself, not a method around it: two marks a step, no Python frame each.
    mark = staticmethod(time.perf_counter)

    def ready(self, mark: float) -> bool:
        return True

    def seconds(self, start: float, end: float) -> float:
        return end - start


class CudaEventClock:
    """CUDA events on the current stream: a mark costs an event record, never a synchronisation.

    An event completes when the stream reaches it, so the time between two marks is the time the
    stream took from one to the other: GPU work, or the CPU's delay in queueing it, whichever
    was longer. `ready` asks without blocking; `seconds` blocks only on an incomplete end mark.
    """

    def mark(self) -> torch.cuda.Event:
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def ready(self, mark: torch.cuda.Event) -> bool:
        return mark.query()

    def seconds(self, start: torch.cuda.Event, end: torch.cuda.Event) -> float:
        end.synchronize()
        return start.elapsed_time(end) / 1000.0


def step_clock_for(device: torch.device) -> StepClock:
    """CUDA events on a CUDA device, the wall clock anywhere else."""
    return CudaEventClock() if device.type == "cuda" else WallClock()


# A training step's marks, kept until they have completed: (before: end of the previous step
# or start of the training segment, start: on_train_batch_start, end: on_train_batch_end,
# samples, measured: false for the warm-up step that also counted FLOPs). A plain tuple, one
# per step: a NamedTuple's constructor is a Python function.
_PendingStep = tuple[Any, Any, Any, int, bool]


@dataclass
class _PendingValidation:
    start: Any
    end: Any
    samples: int


@dataclass
class _TrainTotals:
    seconds: float = 0.0
    wait_seconds: float = 0.0
    samples: int = 0
    batches: int = 0

    def add(self, seconds: float, wait: float, samples: int, batches: int) -> None:
        """Add ``batches`` steps that took ``seconds`` (s), ``wait`` of them waiting for data."""
        self.seconds += seconds
        self.wait_seconds += wait
        self.samples += samples
        self.batches += batches

    def plus(self, other: _TrainTotals) -> _TrainTotals:
        """The totals of both spans."""
        return _TrainTotals(
            self.seconds + other.seconds,
            self.wait_seconds + other.wait_seconds,
            self.samples + other.samples,
            self.batches + other.batches,
        )


class ThroughputMonitorSettings(Settings):
    """The keys of ``callbacks.throughput_monitor`` (conf/callbacks/throughput_monitor.yaml)."""

    peak_tflops: float | None = Field(None, gt=0)
    """The device's peak TFLOPS for the run's precision; wins over the per-precision values;
    null: the value of the run's precision below."""
    peak_tflops_fp16: float | None = Field(None, gt=0)
    """Dense fp16 peak TFLOPS (used under 16-mixed / 16-true)."""
    peak_tflops_bf16: float | None = Field(None, gt=0)
    """Dense bf16 peak TFLOPS (used under bf16-mixed / bf16-true)."""
    peak_tflops_fp32: float | None = Field(None, gt=0)
    """fp32 peak TFLOPS (used under 32-true); null: no perf/mfu."""
    warmup_steps: int = Field(1, ge=1)
    """First training steps left out of every statistic (allocator warm-up, cuDNN autotuning,
    and the step whose FLOPs are counted, which is never a clean timing)."""
    summary_window: int = Field(10_000, ge=1)
    """Recent training steps the end-of-run percentiles cover."""


class ThroughputMonitor(L.Callback):
    """Logs ``perf/*`` throughput metrics during fit and a summary table at its end.

    Its keys are the fields of `ThroughputMonitorSettings`, given as keyword arguments and kept
    validated in ``self.settings`` (see `vramkit.core.config.settings`).

    Without a peak for the run's precision (the CPU profile has none), or for a compiled model,
    ``perf/mfu`` is not reported, FLOPs are not counted, and the run says so once.
    """

    settings_class = ThroughputMonitorSettings

    def __init__(self, **settings: Any) -> None:
        self.settings = ThroughputMonitorSettings.for_component(type(self), settings)
        self.peak_tflops = self.settings.peak_tflops
        self.peaks_by_precision = {
            "fp16": self.settings.peak_tflops_fp16,
            "bf16": self.settings.peak_tflops_bf16,
            "fp32": self.settings.peak_tflops_fp32,
        }
        self.warmup_steps = self.settings.warmup_steps
        self.summary_window = self.settings.summary_window
        self.flops_per_batch: int | None = None
        """Forward + backward FLOPs of one training batch (per device), counted once."""
        self.summary: dict[str, float] = {}
        """The end-of-run numbers of the summary table, keyed like the logged metrics."""
        self._reset()

    def _reset(self) -> None:
        self._clock: StepClock = WallClock()
        self._peak: float | None = None
        self._world_size = 1
        self._flop_counter: FlopCounterMode | None = None
        self._steps_seen = 0
        self._prev_end: Any = None
        self._step_start: Any = None
        self._pending: deque[_PendingStep] = deque()
        self._pending_validation: deque[_PendingValidation] = deque()
        self._window = _TrainTotals()
        self._window_steps: list[float] = []
        self._steps_since_log = 0
        # The run's totals and recent step times up to the last logged window: a step adds to
        # the window only, and each window joins the run when it is logged.
        self._run = _TrainTotals()
        self._recent_steps: deque[float] = deque(maxlen=self.summary_window)
        self._val_start: Any = None
        self._val_samples = 0
        self._val_seconds = 0.0
        self._val_samples_total = 0
        self._last_validation: tuple[float, int] | None = None
        self._counting_this_step = False
        self._flop_attempts = 0
        self._compiled: bool | None = None

    @property
    def measured_steps(self) -> int:
        """Training steps whose times are in the statistics so far (warm-up steps left out)."""
        return self._run_totals().batches

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        self._reset()
        self.flops_per_batch = None
        self.summary = {}
        self._clock = step_clock_for(trainer.strategy.root_device)
        self._world_size = trainer.world_size
        precision = str(trainer.precision)
        self._peak = self.peak_tflops or peak_tflops_for_precision(
            precision, self.peaks_by_precision
        )
        if self._peak is None:
            log.info(
                "perf/mfu is not reported: no peak TFLOPS for precision %s in the hardware "
                "profile (the CPU profile has none)",
                precision,
            )

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # Creating the loader iterator (worker start-up) counts as data wait of the first step.
        self._prev_end = self._clock.mark()

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self._step_start = self._clock.mark()
        self._counting_this_step = (
            self._peak is not None
            and self.flops_per_batch is None
            and self._flop_attempts < _MAX_FLOP_ATTEMPTS
            and not self._model_is_compiled(pl_module)
        )
        if self._counting_this_step:
            # A real step is counted as it runs: no extra forward/backward, no change to
            # BatchNorm statistics or the random stream.
            self._flop_attempts += 1
            self._flop_counter = FlopCounterMode(display=False)
            self._flop_counter.__enter__()

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, *_: Any
    ) -> None:
        end = self._clock.mark()
        if self._flop_counter is not None:
            self._stop_counting_flops()
        self._steps_seen += 1
        self._pending.append(
            (
                self._prev_end,
                self._step_start,
                end,
                batch_size_of(batch) or 0,
                # the counting mode slows its step down: never a clean timing
                self._steps_seen > self.warmup_steps and not self._counting_this_step,
            )
        )
        self._prev_end = end
        self._steps_since_log += 1
        if self._steps_since_log >= trainer.log_every_n_steps:
            self._steps_since_log = 0
            self._resolve(block=False)
            self._log_train_window(trainer)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._resolve(block=True)  # one wait per epoch, for the last steps' marks
        # The step counter has already moved past the epoch's last batch; Lightning logs its own
        # epoch-end metrics one step back, and so does this.
        self._log_train_window(trainer, step=lightning_private.batches_that_stepped(trainer) - 1)

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # trainer.validate() alone has no training to compare with
        if trainer.sanity_checking or trainer.state.fn != TrainerFn.FITTING:
            return
        self._val_start = self._clock.mark()
        self._val_samples = 0

    def on_validation_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, *_: Any
    ) -> None:
        if not trainer.sanity_checking:
            self._val_samples += batch_size_of(batch) or 0

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking or self._val_start is None:
            return
        self._pending_validation.append(
            _PendingValidation(self._val_start, self._clock.mark(), self._val_samples)
        )
        self._val_start = None
        # The ratio needs every training step before this validation: one wait per validation.
        self._resolve(block=True)
        metrics: dict[str, float] = {}
        last = self._last_validation
        if last is not None and last[0] > 0 and last[1] > 0:
            seconds, samples = last
            metrics["perf/val_samples_per_s"] = samples * self._world_size / seconds
            train_per_sample = self._train_seconds_per_sample()
            if train_per_sample is not None:
                metrics["perf/val_train_time_ratio"] = seconds / samples / train_per_sample
        _log_metrics(trainer, metrics)
        # A validation inside an epoch must not count as data wait of the next training step.
        self._prev_end = self._clock.mark()

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._resolve(block=True)
        self.summary = self._summary()
        if trainer.is_global_zero:
            log.info("Throughput summary\n%s", self._render_summary())

    def on_exception(
        self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException
    ) -> None:
        if self._flop_counter is not None:
            self._stop_counting_flops()

    def _model_is_compiled(self, pl_module: L.LightningModule) -> bool:
        # A compiled model run under FlopCounterMode falls back to eager and can stay slow
        # afterwards (pytorch/pytorch#140909): count nothing rather than slow the whole run.
        if self._compiled is None:
            self._compiled = any(
                torch_private.is_compiled(module) for module in pl_module.modules()
            )
            if self._compiled:
                log.info("perf/mfu is not reported: FLOPs of a compiled model are not counted")
        return self._compiled

    def _stop_counting_flops(self) -> None:
        counter, self._flop_counter = self._flop_counter, None
        counter.__exit__(None, None, None)
        flops = counter.get_total_flops()
        # A batch whose images were all unreadable runs no model: the next one is counted.
        if flops > 0:
            self.flops_per_batch = int(flops)
        elif self._flop_attempts >= _MAX_FLOP_ATTEMPTS:
            log.warning(
                "perf/mfu is not reported: %d training steps counted no FLOPs", self._flop_attempts
            )

    def _resolve(self, block: bool) -> None:
        """Turn completed marks into times; without ``block`` stop at the first incomplete one."""
        # Once per logged window, a pass over its steps: sums in locals, added once.
        ready, seconds, pending = self._clock.ready, self._clock.seconds, self._pending
        steps = self._window_steps
        total = wait = 0.0
        samples_total = batches = 0
        while pending:
            before, start, end, samples, measured = pending[0]
            if not block and not ready(end):
                break
            pending.popleft()
            if not measured:
                continue
            iteration = seconds(before, end)
            total += iteration
            wait += seconds(before, start)
            samples_total += samples
            batches += 1
            steps.append(iteration)
        if batches:
            self._window.add(total, wait, samples_total, batches)
        while self._pending_validation:
            span = self._pending_validation[0]
            if not block and not self._clock.ready(span.end):
                break
            self._pending_validation.popleft()
            seconds = self._clock.seconds(span.start, span.end)
            self._val_seconds += seconds
            self._val_samples_total += span.samples
            self._last_validation = (seconds, span.samples)

    def _run_totals(self) -> _TrainTotals:
        """The training totals of the whole run so far, the window not yet logged included."""
        return self._run.plus(self._window)

    def _train_seconds_per_sample(self) -> float | None:
        run = self._run_totals()
        if run.samples == 0:
            return None
        return run.seconds / run.samples

    def _train_metrics(
        self, totals: _TrainTotals, steps: list[float] | deque[float]
    ) -> dict[str, float]:
        if totals.batches == 0 or totals.seconds <= 0:
            return {}
        step_ms = [seconds * 1000.0 for seconds in steps]
        metrics = {
            "perf/train_samples_per_s": totals.samples * self._world_size / totals.seconds,
            "perf/train_step_ms_median": statistics.median(step_ms),
            "perf/train_step_ms_p90": _p90(step_ms),
            "perf/data_wait_fraction": totals.wait_seconds / totals.seconds,
        }
        if self._peak is not None and self.flops_per_batch is not None:
            achieved = self.flops_per_batch * totals.batches / totals.seconds
            metrics["perf/mfu"] = achieved / (self._peak * 1e12)
        return metrics

    def _log_train_window(self, trainer: L.Trainer, step: int | None = None) -> None:
        metrics = self._train_metrics(self._window, self._window_steps)
        self._run = self._run_totals()
        self._recent_steps.extend(self._window_steps)
        self._window = _TrainTotals()
        self._window_steps = []
        _log_metrics(trainer, metrics, step)

    def _summary(self) -> dict[str, float]:
        recent = deque(self._recent_steps, maxlen=self.summary_window)
        recent.extend(self._window_steps)
        summary = self._train_metrics(self._run_totals(), recent)
        if self._val_samples_total > 0 and self._val_seconds > 0:
            summary["perf/val_samples_per_s"] = (
                self._val_samples_total * self._world_size / self._val_seconds
            )
            train_per_sample = self._train_seconds_per_sample()
            if train_per_sample is not None:
                val_per_sample = self._val_seconds / self._val_samples_total
                summary["perf/val_train_time_ratio"] = val_per_sample / train_per_sample
        return summary

    def _render_summary(self) -> str:
        rows = [
            ("training samples/s", "perf/train_samples_per_s", "{:.1f}"),
            ("validation samples/s", "perf/val_samples_per_s", "{:.1f}"),
            ("step time, median (ms)", "perf/train_step_ms_median", "{:.1f}"),
            ("step time, p90 (ms)", "perf/train_step_ms_p90", "{:.1f}"),
            ("waiting for data", "perf/data_wait_fraction", "{:.1%}"),
            ("validation/training time per sample", "perf/val_train_time_ratio", "{:.2f}×"),
            ("model FLOPs utilisation", "perf/mfu", "{:.1%}"),
        ]
        cells = []
        for label, key, fmt in rows:
            value = self.summary.get(key)
            text = "n/a" if value is None else fmt.format(value)
            if key == "perf/mfu" and value is None:
                text = "n/a (no peak TFLOPS)" if self._peak is None else "n/a"
            cells.append([label, text, key])
        if self.flops_per_batch is not None:
            cells.append(["FLOPs per training batch", f"{self.flops_per_batch / 1e9:.2f} G", ""])
        caption = (
            f"{self.measured_steps} training steps measured "
            f"(first {self.warmup_steps} left out; percentiles over the last "
            f"{min(self.measured_steps, self.summary_window)})"
        )
        return render_table(
            ["measure", "value", "metric"],
            cells,
            title="throughput",
            caption=caption,
            left=["metric"],
            width=100,
        )


def _p90(values: list[float]) -> float:
    """The 90th percentile with linear interpolation between the closest ranks (numpy's
    default, ``statistics.quantiles(method="inclusive")``'s), from one sort: numpy's call
    costs tens of microseconds on the ten values of a logging window, ``statistics``' ten."""
    ordered = sorted(values)
    rank = 0.9 * (len(ordered) - 1)
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def _log_metrics(trainer: L.Trainer, metrics: dict[str, float], step: int | None = None) -> None:
    """Send ``metrics`` to every logger, at ``step`` or the step the module's own metrics use,
    with the epoch, as Lightning's logger connector does, but without its ``logger.save()``
    after each call (a file write for the CSV logger): the loggers write these rows with the
    module's next ones, and at the end of the run."""
    if not metrics or not trainer.loggers:
        return
    if step is None:
        step = lightning_private.batches_that_stepped(trainer)
    row = {**metrics, "epoch": trainer.current_epoch}
    for logger in trainer.loggers:
        logger.log_metrics(row, step=step)
