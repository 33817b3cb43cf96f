"""The memory planner: will a run fit a GPU, and at what batch sizes, decided on a CPU.

It traces the task's real LightningModule on fake tensors (no memory, no GPU) for two optimizer
steps and a validation step, applies the CUDA rules a CPU trace cannot see (`cuda_rules`), and
reports the peak of each phase against the profile's budget. Its one input is a `PlanRequest`
(`request.py`: module and data factories, profile, setup, batch sizes; "auto" read by
`batch_size_request` alone); it reads no config. Entry points: `plan_task`
(`scripts/plan_memory.py`, `vramkit plan`) and `resolve_auto_batch_sizes` (`batch_size: auto` in
a profile).
"""

from vramkit.core.planner.decisions.auto_batch import resolve_auto_batch_sizes
from vramkit.core.planner.decisions.plan import (
    TRAIN,
    VAL,
    MemoryPlanner,
    PhasePlan,
    largest_fitting,
)
from vramkit.core.planner.decisions.remedies import Remedy
from vramkit.core.planner.decisions.report import plan_json, plan_table
from vramkit.core.planner.decisions.task_plan import MemoryPlan, plan_task
from vramkit.core.planner.errors import DoesNotFitError, PlanningDataError, PlanningError
from vramkit.core.planner.request import (
    ModelFacts,
    PlanRequest,
    TaskBatchDefaults,
    requested_batch_sizes,
)
from vramkit.core.planner.tracing.run_setup import RunSetup

__all__ = [
    "TRAIN",
    "VAL",
    "DoesNotFitError",
    "MemoryPlan",
    "MemoryPlanner",
    "ModelFacts",
    "PhasePlan",
    "PlanRequest",
    "PlanningDataError",
    "PlanningError",
    "Remedy",
    "RunSetup",
    "TaskBatchDefaults",
    "largest_fitting",
    "plan_json",
    "plan_table",
    "plan_task",
    "requested_batch_sizes",
    "resolve_auto_batch_sizes",
]
