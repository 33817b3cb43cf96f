"""A stand-in for `MemoryPlanner` whose peaks are a formula of the setup (GiB), for fast and
exact tests of the decisions made on top of plans (automatic fitting)."""

from __future__ import annotations

from dataclasses import dataclass

from vramkit.core.hardware.profile import HardwareProfile
from vramkit.core.planner.cuda.optimizer_layouts import ADAMW_8BIT, CONFIGURED, ZERO2_OFFLOAD
from vramkit.core.planner.decisions.plan import INFERENCE, TRAIN, VAL, PhasePlan, largest_fitting
from vramkit.core.planner.decisions.remedies import Change
from vramkit.core.planner.decisions.task_plan import MemoryPlan
from vramkit.core.planner.request import ModelFacts
from vramkit.core.planner.tracing.recorder import (
    ACTIVATIONS,
    GRADIENTS,
    INPUTS,
    OPTIMIZER_STATE,
    PARAMETERS,
)
from vramkit.core.planner.tracing.run_setup import RunSetup
from vramkit.core.units import GIB

PROFILE = HardwareProfile(
    name="laptop",
    accelerator="gpu",
    precision="bf16-mixed",
    memory_gib=16.0,
    compute_capability="8.9",
    bf16=True,
)


@dataclass(frozen=True)
class LoraSetup(RunSetup):
    """A setup that can also train adapters only (what the LoRA remedy changes)."""

    lora: bool = False


LORA_CHANGE = Change("LoRA r=8", ("model.lora.r=8",), "", {"lora": True}, needs_consent="lora")


class FormulaPlanner:
    """Peaks in GiB from the setup: 4 B/parameter weights and gradients, 8 B AdamW state, 2 B
    8-bit state, none on the GPU with offload; activations per sample, a tenth with
    checkpointing; bf16-true halves the model states; LoRA keeps frozen weights only."""

    def __init__(self, parameters_gib: float = 1.0, per_sample_gib: float = 1.0) -> None:
        self.parameters = parameters_gib
        self.per_sample = per_sample_gib
        self.model = ModelFacts(optimizer="AdamW", adam=True, gradient_checkpointing=False)
        self.bitsandbytes_optimizer = None
        self.traces = 0

    def measure(self, phase: str, batch_size: int, setup: RunSetup) -> PhasePlan:
        self.traces += 1
        scale = 0.5 if setup.precision == "bf16-true" else 1.0
        weights = 4 * self.parameters * scale
        trained = 0.0 if getattr(setup, "lora", False) else 1.0
        gradients = weights * trained
        state = {CONFIGURED: 8.0, ADAMW_8BIT: 2.0, ZERO2_OFFLOAD: 0.0}[setup.optimizer]
        optimizer = state * self.parameters * scale * trained
        per_sample = self.per_sample * (0.1 if setup.gradient_checkpointing else 1.0)
        if phase != TRAIN:
            per_sample = self.per_sample / 4
        allocated = {
            PARAMETERS: weights,
            GRADIENTS: gradients,
            OPTIMIZER_STATE: optimizer,
            ACTIVATIONS: per_sample * batch_size,
            INPUTS: 0.0,
        }
        return PhasePlan(
            phase=phase,
            batch_size=batch_size,
            accumulate_grad_batches=setup.accumulate_grad_batches if phase == TRAIN else 1,
            allocated={key: int(value * GIB) for key, value in allocated.items()},
            overhead=0,
            workspace=0,
            peak_at="formula",
        )

    def training_verdict(self, batch_size: int, setup: RunSetup, budget_bytes: int) -> PhasePlan:
        return self.measure(TRAIN, batch_size, setup)  # a formula has no bound to take

    def largest_batch_size(self, phase, setup, budget_bytes, upper):
        best = largest_fitting(
            lambda size: self.measure(phase, size, setup).peak, budget_bytes, upper
        )
        return best, self.measure(phase, max(best, 1), setup)


def formula_plan(request):
    """plan_task's stand-in: the formula planner at the requested sizes (1 for a search)."""
    profile = request.profile
    train_batch_size, val_batch_size = request.train_batch_size, request.val_batch_size
    planner = FormulaPlanner(per_sample_gib=6.0)
    setup = LoraSetup(precision=profile.precision, device=None)
    budget = int(profile.budget_gib * GIB)
    return MemoryPlan(
        profile=profile,
        setup=setup,
        optimizer="AdamW",
        budget_bytes=budget,
        train=planner.measure(TRAIN, train_batch_size or 1, setup),
        val=planner.measure(VAL, val_batch_size or 1, setup),
        inference=planner.measure(INFERENCE, val_batch_size or 1, setup),
        train_searched=train_batch_size is None,
        val_searched=val_batch_size is None,
        train_limit=None,
        val_limit=None,
        remedies=(),
        traces=2,
        seconds=0.0,
        planner=planner,
    )
