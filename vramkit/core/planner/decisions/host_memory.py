"""Host memory of a run: the process's resident set planned per phase, and the host's budget.

A run's host memory is what the kernel counts against the machine (and kills for): the Python
process with torch and Lightning imported, whatever of the step lives on the host, the batches
the loaders hold and their worker processes, page-locked copies for the GPU and optimizer state
that DeepSpeed offloads. `HostPlanner` adds those up per phase from the device planner's traces:

- baseline: the process before the model is built, read where the plan is made (this process
  has imported torch, Lightning, Hydra and the task's code and holds its data); at least
  `IMPORT_BASELINE_BYTES`.
- step: on the `cpu` profile everything the trace sees (parameters, gradients, optimizer state,
  activations and the batch), i.e. the device plan applied to the host, with activations and
  temporaries times `CPU_STEP_ALLOWANCE`; validation inside fit keeps the training step's; 0 on
  a GPU.
- offloaded: DeepSpeed's host copy under ZeRO offload, by DeepSpeed's own estimators
  (`estimate_zero2_model_states_mem_needs`, `estimate_zero3_model_states_mem_needs`):
  parameters × max(4 × GPUs per node, 16) bytes (18 with parameter offload) × 1.5 buffers;
  plus, on a GPU, a paged bitsandbytes optimizer's states, which live in CUDA unified memory
  (`cudaMallocManaged`) and are counted against the host (`MemoryPlanner.paged_optimizer_bytes`).
- batches in flight: with loader workers, `num_workers × prefetch_factor` finished batches wait
  in shared memory for the main process (torch's `_MultiProcessingDataLoaderIter` keeps that many
  outstanding); without workers the loader's batch is the step's own.
- workers: each worker process is assumed to own a copy of the dataset (a forked worker shares
  the parent's pages until Python's reference counts write to them, and they do: the copy is
  measured as the dataset's pickled size) plus the batch it is building, on top of
  `WORKER_BASELINE_BYTES` of its own.
- pinned: with `pin_memory` on a GPU, the pinning thread copies each batch in flight into
  page-locked memory, and torch's caching host allocator rounds each block up to a power of two.

`host_budget` reads what the host has for this run: MemAvailable (which already leaves out the
other processes) plus this process's own resident set, capped by its cgroup's memory limit and by
the address space an RLIMIT_AS (`ulimit -v`, `prlimit --as`) leaves it.
"""

from __future__ import annotations

import dataclasses
import math
import pickle
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

from vramkit.core.data.loaders import DEFAULT_NUM_WORKERS
from vramkit.core.hardware.memory_stats import HostRoom, read_host_memory, read_host_room
from vramkit.core.planner.decisions.plan import TRAIN, VAL, MemoryPlanner, largest_fitting
from vramkit.core.planner.tracing.recorder import GRADIENTS, OPTIMIZER_STATE, PARAMETERS
from vramkit.core.planner.tracing.run_setup import RunSetup
from vramkit.core.units import GIB

IMPORT_BASELINE_BYTES = 449_916_928
"""Resident set of a process that imported torch and Lightning and nothing else (bytes):
439,372 kB measured with `python -c "import torch, lightning"` reading VmRSS from
/proc/self/status (torch 2.13.0+cpu, Lightning 2.6, Python 3.11); the planning process reads
its own, which is larger (Hydra, the task's code and data)."""

WORKER_BASELINE_BYTES = 64 * 2**20
"""A loader worker's own memory before its dataset copy and batches (bytes): the pages of the
forked interpreter it writes. Measured: 9 MiB private dirty per worker (two workers over a
TensorDataset after 8 batches, /proc/<pid>/smaps_rollup; torch 2.13.0+cpu); the parent's pages a
worker writes later (its heap, reference counts) grow it, so 64 MiB is the planned allowance."""

MODEL_STATES = (PARAMETERS, GRADIENTS, OPTIMIZER_STATE)
"""What a step allocates once and keeps: counted on the host as traced."""

CPU_STEP_ALLOWANCE = 1.75
"""Resident bytes a step run on the CPU takes per byte of activations, temporaries and batch its
trace holds at the peak. The traced bytes are the run's: attention included, since a fake CPU
tensor goes through torch's own kernel choice (`select_sdp_backend_cpp`, aten/src/ATen/native/
transformers/sdp_utils_cpp.cpp): a mask takes the CPU flash kernel, which keeps a [B, H, T]
log-sum-exp, and dropout the math path, whose [B, H, T, S] weights the trace then holds too. The
allowance is glibc's: after freeing a block above the mmap threshold, malloc raises the threshold
to that size (up to 32 MiB; `man mallopt`, M_MMAP_THRESHOLD), so later activations come from the
heap and its arenas, which keep freed pages resident. Measured (MemoryMonitor's
mem/train_peak_gib minus the planning baseline, over the traced step, torch 2.13.0+cpu) with
`python train.py task=text_classification +hw=cpu data.max_length=256 logger=csv
hw.num_workers=0 hw.batch_size=64 trainer.max_epochs=1 +trainer.limit_train_batches=3
+trainer.limit_val_batches=1`: 1.69-1.86 at batch 64 (five runs, planned at 0.80 GiB, read
0.79-0.82 GiB: up to 2.5% low), 1.62-1.69 at batch 128 (1.04-1.08 with
MALLOC_MMAP_THRESHOLD_=131072, a fixed threshold); the SAGE teacher's smoke command in
docs/reliability.md at batch 1: 1.28-1.39 (0.90 fixed), so its plan is 13-19% high."""

DEFAULT_PREFETCH_FACTOR = 2
"""torch's DataLoader default: batches each worker prepares ahead."""

_DEEPSPEED_BUFFER_FACTOR = 1.5  # DeepSpeed estimators' `additional_buffer_factor`


@dataclass(frozen=True)
class LoaderMemory:
    """What a phase's data loader holds on the host, per batch (bytes) and in count."""

    batch_bytes: int
    """One collated batch at the phase's batch size."""
    dataset_bytes: int
    """The phase's dataset as a worker's copy holds it (its pickled size)."""
    num_workers: int = DEFAULT_NUM_WORKERS
    prefetch_factor: int = DEFAULT_PREFETCH_FACTOR
    pin_memory: bool = False

    @property
    def in_flight(self) -> int:
        """Finished batches waiting for the main process (0 without workers)."""
        return self.num_workers * self.prefetch_factor


@dataclass(frozen=True)
class HostPhasePlan:
    """The planned resident set of one phase (bytes), and of what it is made."""

    phase: str
    batch_size: int
    baseline: int
    step: int
    offloaded: int
    batches: int
    workers: int
    pinned: int
    processes: int = 1
    """Processes of the run on this host (e.g. 2 under trainer=ddp_sim); the parts are each's."""

    @property
    def total(self) -> int:
        """The run's host memory at this phase's peak, worker processes included (bytes)."""
        each = self.baseline + self.step + self.offloaded + self.batches + self.workers
        return self.processes * (each + self.pinned)

    @property
    def main_process(self) -> int:
        """One training process's own resident set, without its loader workers (bytes): what
        its VmRSS (MemoryMonitor's `mem/<phase>_peak_gib` on a CPU) should read at the peak."""
        return self.baseline + self.step + self.offloaded + self.batches + self.pinned

    def parts_gib(self) -> dict[str, float]:
        """Each part and the total in GiB, for a table or a JSON record."""
        parts = {
            "baseline": self.baseline,
            "step": self.step,
            "offloaded": self.offloaded,
            "batches": self.batches,
            "workers": self.workers,
            "pinned": self.pinned,
            "total": self.total,
        }
        return {name: round(size / GIB, 3) for name, size in parts.items()}

    def summary(self) -> str:
        """One phrase: total and its non-zero parts, e.g. "2.31 GiB (baseline 0.45, step 1.80…)"."""
        parts = ", ".join(
            f"{name} {size:.2f}"
            for name, size in self.parts_gib().items()
            if name != "total" and size > 0
        )
        times = f" × {self.processes} processes" if self.processes > 1 else ""
        return f"{self.total / GIB:.2f} GiB ({parts}{times})"


@dataclass(frozen=True)
class HostBudget:
    """What this run may use of the host (bytes), and where the number came from."""

    available: int
    """MemAvailable plus this process's resident set, capped by the cgroup's limit."""
    fraction: float
    """Share of `available` a run plans to use (the profile's `memory_budget_fraction`)."""
    source: str
    """E.g. "MemAvailable 21.3 GiB + this process 0.45 GiB"."""
    capped_from: float | None = None
    """The stated `hw.memory_gib` (GiB) when the host has less for this process now, and
    `available` is what it has: a plan must fit the machine, whatever was stated."""

    @property
    def budget(self) -> int:
        """The bytes a plan must stay within."""
        return int(self.available * self.fraction)

    def describe(self) -> str:
        """E.g. "18.5 GiB (85% of 21.8 GiB: MemAvailable 21.3 GiB + this process 0.45 GiB)"."""
        return (
            f"{self.budget / GIB:.2f} GiB ({self.fraction:.0%} of {self.available / GIB:.2f} GiB: "
            f"{self.source})"
        )


def host_budget(
    fraction: float, *, memory_gib: float | None = None, room: HostRoom | None = None
) -> HostBudget | None:
    """The host memory this process may grow into, times `fraction`; None where /proc cannot be
    read. `memory_gib` (the `cpu` profile's `memory_gib`) states it instead of reading the host,
    but no more than the host has for this process now (`room`, read when None): a stated
    budget above it is capped there (`HostBudget.capped_from`), so no planned step is larger
    than the machine.
    """
    room = room if room is not None else read_host_room()
    if memory_gib is not None:
        stated = int(memory_gib * GIB)
        if room is None or stated <= room.total:
            return HostBudget(stated, fraction, f"hw.memory_gib {memory_gib:g} GiB")
        return HostBudget(
            room.total,
            fraction,
            f"hw.memory_gib {memory_gib:g} GiB capped to {room.source} + this process "
            f"{room.own / GIB:.2f} GiB",
            capped_from=memory_gib,
        )
    if room is None:
        return None
    return HostBudget(
        room.total, fraction, f"{room.source} + this process {room.own / GIB:.2f} GiB"
    )


def process_baseline() -> int:
    """This process's resident set now, at least `IMPORT_BASELINE_BYTES` (bytes)."""
    reading = read_host_memory()
    return max(reading.current if reading else 0, IMPORT_BASELINE_BYTES)


def batch_bytes(sample: Any, batch_size: int) -> int:
    """Bytes of the tensors of a collated one-sample `sample` grown to `batch_size`."""
    return sum(t.nbytes for t in _tensors(sample)) * batch_size


def dataset_bytes(dataset: Any) -> int | None:
    """A worker's copy of `dataset`: its pickled size (bytes); None when it does not pickle."""
    try:
        return len(pickle.dumps(dataset, protocol=pickle.HIGHEST_PROTOCOL))
    except Exception:  # lambdas, open files, generators: the size is unknown, not an error
        return None


def offloaded_bytes(strategy: str, parameters: int, gpus_per_node: int) -> int:
    """DeepSpeed's host memory for `parameters` under ZeRO offload (bytes); 0 without offload.

    DeepSpeed's `estimate_zero2_model_states_mem_needs` (cpu_offload) and
    `estimate_zero3_model_states_mem_needs` (offload_param + offload_optimizer):
    parameters × max(4 × GPUs per node, 16 or 18) × 1.5 (fp32 master weights, gradients and
    Adam's two moments, plus DeepSpeed's buffers).
    """
    if strategy == "deepspeed_zero2_offload":
        per_parameter = max(4 * gpus_per_node, 16)
    elif strategy == "deepspeed_zero3_offload":
        per_parameter = max(4 * gpus_per_node, 18)
    else:
        return 0
    return math.ceil(parameters * per_parameter * _DEEPSPEED_BUFFER_FACTOR)


def plan_host_phase(
    phase: str,
    batch_size: int,
    *,
    baseline: int,
    step: int,
    loader: LoaderMemory,
    idle_loaders: tuple[LoaderMemory, ...] = (),
    offloaded: int = 0,
    gpu: bool = False,
) -> HostPhasePlan:
    """The host plan of one phase.

    `step`: the traced phase's peak when it runs on the host (the `cpu` profile), else 0.
    `loader` is the phase's own (its `batch_bytes` at `batch_size`); `idle_loaders` are the
    other phases' loaders whose persistent workers stay alive meanwhile (a validation inside
    fit keeps the training workers). Pinning applies only on a GPU.
    """
    in_flight = loader.in_flight
    pinned = 0
    if gpu and loader.pin_memory:
        pinned = max(in_flight, 1) * _next_power_of_two(loader.batch_bytes)
    return HostPhasePlan(
        phase=phase,
        batch_size=batch_size,
        baseline=baseline,
        step=step,
        offloaded=offloaded,
        batches=in_flight * loader.batch_bytes,
        workers=sum(_worker_bytes(each) for each in (loader, *idle_loaders)),
        pinned=pinned,
    )


def _worker_bytes(loader: LoaderMemory) -> int:
    own = WORKER_BASELINE_BYTES + loader.dataset_bytes + loader.batch_bytes
    return loader.num_workers * own


def _next_power_of_two(size: int) -> int:
    # torch's CachingHostAllocator rounds each page-locked block up to a power of two
    return 1 << (size - 1).bit_length() if size > 1 else size


def _tensors(value: Any) -> Iterable[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _tensors(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensors(item)


@dataclass(frozen=True)
class LoaderSettings:
    """How the run's loaders are set: workers per loader, prefetching, pinning."""

    num_workers: int
    prefetch_factor: int = DEFAULT_PREFETCH_FACTOR
    pin_memory: bool = False
    persistent_workers: bool = True


@dataclass
class HostPlanner:
    """Plans a run's host memory per phase and batch size from the device planner's traces."""

    planner: MemoryPlanner
    setup: RunSetup
    loaders: LoaderSettings
    baseline: int
    processes: int = 1
    offloaded: int = 0
    _datasets: dict[str, int] = field(default_factory=dict, repr=False)

    @property
    def on_host(self) -> bool:
        """The step itself runs on the host (no GPU to plan: the `cpu` profile)."""
        return self.setup.device is None

    def plan(self, phase: str, batch_size: int, other_batch_size: int) -> HostPhasePlan:
        """The host plan of `phase` at `batch_size`, the other phase's loader at
        `other_batch_size` (its persistent workers stay alive)."""
        other = VAL if phase == TRAIN else TRAIN
        step = 0
        if self.on_host:
            step = self._resident_step(phase, batch_size)
            if phase == VAL:
                # glibc returns little of what training freed to the kernel: a validation inside
                # fit keeps the training step's resident set
                step = max(step, self._resident_step(TRAIN, other_batch_size))
        idle = (self._loader(other, other_batch_size),) if self.loaders.persistent_workers else ()
        plan = plan_host_phase(
            phase,
            batch_size,
            baseline=self.baseline,
            step=step,
            loader=self._loader(phase, batch_size),
            idle_loaders=idle,
            offloaded=self.offloaded + self._paged(),
            gpu=not self.on_host,
        )
        return dataclasses.replace(plan, processes=self.processes)

    def largest_batch_size(self, phase: str, budget: int, upper: int, other_batch_size: int) -> int:
        """The largest batch size in 1..`upper` whose host plan fits `budget` (0: none)."""
        return largest_fitting(
            lambda size: self.plan(phase, size, other_batch_size).total,
            budget,
            upper,
            upper_first=True,
        )

    def _paged(self) -> int:
        # On the CPU a paged optimizer falls back to ordinary tensors, which the step holds.
        return 0 if self.on_host else self.planner.paged_optimizer_bytes(self.setup)

    def _resident_step(self, phase: str, batch_size: int) -> int:
        """The resident set a step run on the host adds: the model states as traced, the rest
        (activations, temporaries, the batch) times `CPU_STEP_ALLOWANCE`."""
        traced = self.planner.measure(phase, batch_size, self.setup)
        states = sum(traced.allocated.get(kind, 0) for kind in MODEL_STATES)
        return states + math.ceil((traced.peak - states) * CPU_STEP_ALLOWANCE)

    def _loader(self, phase: str, batch_size: int) -> LoaderMemory:
        samples = self.planner.samples
        sample = samples.train if phase == TRAIN else samples.val
        return LoaderMemory(
            batch_bytes=batch_bytes(sample, batch_size),
            dataset_bytes=self._dataset_bytes(phase) if self.loaders.num_workers else 0,
            num_workers=self.loaders.num_workers,
            prefetch_factor=self.loaders.prefetch_factor,
            pin_memory=self.loaders.pin_memory,
        )

    def _dataset_bytes(self, phase: str) -> int:
        if phase not in self._datasets:
            samples = self.planner.samples
            dataset = samples.train_dataset if phase == TRAIN else samples.val_dataset
            self._datasets[phase] = dataset_bytes(dataset) or 0
        return self._datasets[phase]
