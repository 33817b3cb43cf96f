"""Check a plan on the real GPU: a few training and validation steps at the planned batch sizes.

``vramkit plan --verify`` plans, then fits the real module for `steps` training batches and
`steps` validation batches (validation inside fit, as a run does), reads
``torch.cuda.max_memory_allocated`` and ``max_memory_reserved`` per phase (the statistics are
reset when each phase starts) and compares them with the plan. Each phase becomes one case in
the format of ``benchmarks/field_cases/*.json`` (GPU, frameworks, run settings, measured figures,
and the plan's prediction), appended to a JSON file the user can share.
"""

from __future__ import annotations

import json
import platform
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from torch.utils.data import DataLoader

from vramkit.core.config.schema import ConfigError
from vramkit.core.io.checkpoint_io import atomic_write_bytes
from vramkit.core.planner.decisions.plan import TRAIN, VAL, PhasePlan
from vramkit.core.planner.decisions.task_plan import MemoryPlan
from vramkit.core.units import GIB

MIB = 2**20


class NeedsGpuError(ConfigError):
    """`--verify` on a host without a CUDA device: nothing to measure."""


def require_gpu() -> None:
    """Refuse (`NeedsGpuError`) unless torch sees a CUDA device."""
    if not torch.cuda.is_available():
        build = "a CPU build" if torch.version.cuda is None else f"CUDA {torch.version.cuda}"
        raise NeedsGpuError(
            f"--verify runs real steps and needs a CUDA GPU; torch {torch.__version__} ({build}) "
            "sees none here. Plan without --verify on this host."
        )


@dataclass(frozen=True)
class MeasuredPhase:
    """The allocator's peaks over one phase (bytes)."""

    max_allocated: int
    max_reserved: int


class PhasePeaks(Callback):
    """Reads ``torch.cuda``'s peak statistics per phase of a fit: training from its start to the
    first validation, validation from its start to its end."""

    def __init__(self) -> None:
        self.measured: dict[str, MeasuredPhase] = {}

    @staticmethod
    def _read() -> MeasuredPhase:
        return MeasuredPhase(torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved())

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        torch.cuda.reset_peak_memory_stats()

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking or TRAIN in self.measured:
            return
        self.measured[TRAIN] = self._read()
        torch.cuda.reset_peak_memory_stats()

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.sanity_checking and VAL not in self.measured:
            self.measured[VAL] = self._read()


def phase_loader(loader: DataLoader, batch_size: int) -> DataLoader:
    """`loader`'s dataset and collation at `batch_size`, in order, without workers."""
    return DataLoader(loader.dataset, batch_size=batch_size, collate_fn=loader.collate_fn)


def measure_phases(
    module: L.LightningModule,
    train_loader: DataLoader,
    val_loader: DataLoader,
    *,
    precision: str,
    accumulate_grad_batches: int = 1,
    steps: int = 3,
    accelerator: str = "gpu",
) -> dict[str, MeasuredPhase]:
    """Fit `module` for `steps` training and `steps` validation batches; the peaks per phase.

    At least two training steps: AdamW creates its state on the first step, and step N's forward
    runs before step N-1's gradients are freed (docs: "measure at least two steps")."""
    if steps < 2:
        raise ValueError(
            f"steps must be at least 2 (optimizer state appears at step 1), got {steps}"
        )
    peaks = PhasePeaks()
    trainer = L.Trainer(
        accelerator=accelerator,
        devices=1,
        precision=precision,
        max_epochs=1,
        limit_train_batches=steps * accumulate_grad_batches,
        limit_val_batches=steps,
        accumulate_grad_batches=accumulate_grad_batches,
        num_sanity_val_steps=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[peaks],
    )
    trainer.fit(module, train_dataloaders=train_loader, val_dataloaders=val_loader)
    return peaks.measured


def planned_reserved(plan: MemoryPlan, phase: PhasePlan) -> int:
    """What `torch.cuda.max_memory_reserved()` should read: the peak less the CUDA context
    (the field benchmark's `max_reserved`, bytes)."""
    device = plan.setup.device
    return phase.peak - (device.cuda_context_bytes() if device is not None else 0)


def _error_pct(planned: int, measured: int) -> float | None:
    return None if measured == 0 else round(100.0 * (planned - measured) / measured, 1)


def comparison_rows(plan: MemoryPlan, measured: dict[str, MeasuredPhase]) -> list[dict[str, Any]]:
    """Planned against measured per phase (GiB, and the plan's error in % of the measurement)."""
    rows = []
    for name, phase in ((TRAIN, plan.train), (VAL, plan.val)):
        if name not in measured:
            continue
        got = measured[name]
        reserved = planned_reserved(plan, phase)
        rows.append(
            {
                "phase": name,
                "batch_size": phase.batch_size,
                "planned_max_allocated_gib": round(phase.predicted_max_allocated / GIB, 3),
                "measured_max_allocated_gib": round(got.max_allocated / GIB, 3),
                "max_allocated_error_pct": _error_pct(
                    phase.predicted_max_allocated, got.max_allocated
                ),
                "planned_max_reserved_gib": round(reserved / GIB, 3),
                "measured_max_reserved_gib": round(got.max_reserved / GIB, 3),
                "max_reserved_error_pct": _error_pct(reserved, got.max_reserved),
            }
        )
    return rows


def comparison_table(rows: list[dict[str, Any]]) -> str:
    """The rows as a table: one line per phase."""
    lines = ["phase  batch  max_allocated GiB: planned / measured (error)  max_reserved GiB: ditto"]
    for row in rows:
        allocated = (
            f"{row['planned_max_allocated_gib']:.3f} / {row['measured_max_allocated_gib']:.3f} "
            f"({row['max_allocated_error_pct']:+}%)"
        )
        reserved = (
            f"{row['planned_max_reserved_gib']:.3f} / {row['measured_max_reserved_gib']:.3f} "
            f"({row['max_reserved_error_pct']:+}%)"
        )
        lines.append(f"{row['phase']:<5}  {row['batch_size']:>5}  {allocated:<44}  {reserved}")
    return "\n".join(lines)


def _gpu() -> dict[str, Any]:
    props = torch.cuda.get_device_properties(0)
    return {
        "name": torch.cuda.get_device_name(0),
        "memory_gib": round(props.total_memory / GIB, 2),
        "compute_capability": f"{props.major}.{props.minor}",
    }


def field_cases(
    plan: MemoryPlan,
    measured: dict[str, MeasuredPhase],
    *,
    model: str,
    command: str,
    steps: int,
) -> list[dict[str, Any]]:
    """One case per measured phase, in the field benchmark's format (`benchmarks/field_cases`)."""
    gpu = _gpu()
    slug = "".join(c if c.isalnum() else "_" for c in gpu["name"].lower()).strip("_")
    cases = []
    for row in comparison_rows(plan, measured):
        phase = row["phase"]
        got = measured[phase]
        cases.append(
            {
                "id": f"{model.rsplit('.', 1)[-1].lower()}_{slug}_{phase}_b{row['batch_size']}",
                "title": f"{model}, {gpu['name']}, {phase} at batch {row['batch_size']}",
                "source": {"what": "vramkit plan --verify", "command": command},
                "gpu": gpu,
                "frameworks": {
                    "torch": torch.__version__,
                    "lightning": L.__version__,
                    "cuda": torch.version.cuda,
                    "python": platform.python_version(),
                },
                "model": {"target": model},
                "run": {
                    "phase": phase,
                    "batch_size": row["batch_size"],
                    "accumulate_grad_batches": plan.setup.accumulate_grad_batches,
                    "precision": plan.setup.precision,
                    "optimizer": plan.optimizer,
                    "steps": steps,
                },
                "measured": [
                    {
                        "kind": "max_allocated",
                        "value": round(got.max_allocated / MIB, 1),
                        "unit": "MiB",
                        "what": f"torch.cuda.max_memory_allocated() over the {phase} phase",
                    },
                    {
                        "kind": "max_reserved",
                        "value": round(got.max_reserved / MIB, 1),
                        "unit": "MiB",
                        "what": f"torch.cuda.max_memory_reserved() over the {phase} phase",
                    },
                ],
                "planned": {
                    "max_allocated_mib": round(row["planned_max_allocated_gib"] * GIB / MIB, 1),
                    "max_reserved_mib": round(row["planned_max_reserved_gib"] * GIB / MIB, 1),
                },
                "oom": None,
            }
        )
    return cases


def append_cases(path: Path, cases: list[dict[str, Any]]) -> None:
    """Add `cases` to the ``{"cases": [...]}`` file at `path` (created when absent)."""
    path = Path(path)
    existing: list[dict[str, Any]] = []
    if path.exists():
        try:
            existing = json.loads(path.read_text())["cases"]
        except (json.JSONDecodeError, KeyError, TypeError) as error:
            raise ConfigError(
                f"{path}: not a vramkit --verify file ({error}); name another"
            ) from None
    text = json.dumps({"cases": [*existing, *cases]}, indent=2) + "\n"
    atomic_write_bytes(path, text.encode())


def verify_plan(
    plan: MemoryPlan,
    build_module: Callable[[], L.LightningModule],
    train_loader: DataLoader,
    val_loader: DataLoader,
    *,
    steps: int = 3,
) -> dict[str, MeasuredPhase]:
    """Run `build_module()`'s real steps at `plan`'s batch sizes on the GPU; the peaks per phase."""
    require_gpu()
    return measure_phases(
        build_module(),
        phase_loader(train_loader, plan.train.batch_size),
        phase_loader(val_loader, plan.val.batch_size),
        precision=plan.setup.precision,
        accumulate_grad_batches=plan.setup.accumulate_grad_batches,
        steps=steps,
    )
