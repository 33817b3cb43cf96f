"""Plan a composed training config on a hardware profile: the entry point of the planner.

`plan_task` builds the task's real datamodule (for one sample per phase) and its LightningModule
(fake weights), traces training, validation inside fit and inference on its own, searches the
largest batch sizes where asked, and proposes remedies when the run does not fit.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field

from omegaconf import DictConfig, OmegaConf, open_dict

from vramkit.core.config.instantiate import instantiate
from vramkit.core.hardware.profile import HardwareProfile
from vramkit.core.planner.decisions.plan import INFERENCE, TRAIN, VAL, MemoryPlanner, PhasePlan
from vramkit.core.planner.decisions.remedies import Remedy, propose_remedies
from vramkit.core.planner.tracing.batches import PhaseSamples, sample_batches
from vramkit.core.planner.tracing.recorder import GRADIENTS, OPTIMIZER_STATE, PARAMETERS
from vramkit.core.planner.tracing.run_setup import RunSetup
from vramkit.core.planner.tracing.sharding import Sharding, sharding_of
from vramkit.core.planner.tracing.subject import swap_bitsandbytes_optimizer
from vramkit.core.units import GIB

# Batch sizes searched when the dataset does not say how many samples it has.
UNBOUNDED_BATCH = 4096


@dataclass(frozen=True)
class MemoryPlan:
    """The planner's answer for one profile: the three phases, the verdict and the remedies."""

    profile: HardwareProfile
    setup: RunSetup
    optimizer: str
    """The configured optimizer's class name (e.g. "AdamW")."""
    budget_bytes: int | None
    """The profile's memory budget; None for a CPU profile."""
    train: PhasePlan
    val: PhasePlan
    inference: PhasePlan
    """Evaluation on its own (`eval.py`): eval mode under `torch.inference_mode`, parameters and
    buffers only resident; the largest batch that fits when the validation batch is searched."""
    train_searched: bool
    """The training batch size is the largest that fits (it was "auto")."""
    val_searched: bool
    """The validation and inference batch sizes are the largest that fit (they were "auto")."""
    train_limit: int | None
    """The training dataset's size, which caps a searched batch size."""
    val_limit: int | None
    remedies: tuple[Remedy, ...]
    traces: int
    """Phase traces run to make this plan."""
    seconds: float
    """Wall time of the planning, sample loading included (s)."""
    planner: MemoryPlanner = field(repr=False, compare=False)
    """The planner that made this plan, to measure more setups with the same model and data."""

    @property
    def budget_gib(self) -> float | None:
        """`budget_bytes` in GiB."""
        return None if self.budget_bytes is None else self.budget_bytes / GIB

    @property
    def fits(self) -> bool | None:
        """Training and validation inside fit both fit the budget (None without a budget); the
        inference phase is planned for `eval.py`, a run of its own."""
        if self.budget_bytes is None:
            return None
        return self.train.peak <= self.budget_bytes and self.val.peak <= self.budget_bytes


def planning_config(cfg: DictConfig, profile: HardwareProfile) -> DictConfig:
    """A copy of `cfg` whose `hw` holds `profile` with integer batch sizes, for instantiation.

    The datamodule validates its batch sizes; the planner only takes one sample from it, in
    this process, so "auto" becomes 1 there and the loaders get no workers and no pinning.
    """
    planning = copy.deepcopy(cfg)
    values = profile.model_dump()
    for key in ("batch_size", "val_batch_size"):
        if not isinstance(values[key], int):
            values[key] = 1
    values.update(num_workers=0, pin_memory=False)
    with open_dict(planning):
        planning.hw = OmegaConf.create(values)
    return planning


def _optimizer_name(model_cfg: DictConfig) -> str:
    optimizer = model_cfg.get("optimizer")
    if isinstance(optimizer, DictConfig) and "_target_" in optimizer:
        return str(optimizer._target_).rsplit(".", 1)[-1]
    return "configure_optimizers()"


def _trainer_length(cfg: DictConfig) -> tuple[int, int]:
    trainer = cfg.get("trainer") or {}
    max_epochs = trainer.get("max_epochs") or 1
    max_steps = trainer.get("max_steps")
    return int(max_epochs), int(max_steps) if max_steps is not None else -1


def run_sharding(cfg: DictConfig, profile: HardwareProfile) -> Sharding:
    """How `cfg`'s trainer spreads the run: its strategy on `devices × num_nodes` processes.

    The trainer's own integer `devices` / `num_nodes` (e.g. trainer=ddp_sim's 2 processes) win
    over the profile's; interpolations of the profile are not resolved here (that would plan).
    """
    trainer = cfg.get("trainer")
    if not isinstance(trainer, DictConfig):
        return sharding_of({}, profile.world_size)  # Lightning's "auto"
    raw = OmegaConf.to_container(trainer, resolve=False)
    devices = raw.get("devices")
    nodes = raw.get("num_nodes")
    world = (devices if isinstance(devices, int) else profile.devices) * (
        nodes if isinstance(nodes, int) else profile.num_nodes
    )
    return sharding_of(raw, world)


def _resident(plan: PhasePlan) -> int:
    """Parameters, gradients and optimizer state at `plan`'s peak (bytes)."""
    held = plan.allocated
    return held[PARAMETERS] + held[GRADIENTS] + held[OPTIMIZER_STATE]


def profile_setup(cfg: DictConfig, profile: HardwareProfile) -> RunSetup:
    """The `RunSetup` `cfg`'s run has on `profile`: its precision, strategy and activation
    offload."""
    offload = OmegaConf.select(cfg, "callbacks.activation_offload.enabled", default=False)
    return RunSetup.from_profile(profile).replace(
        activation_offload=bool(offload), sharding=run_sharding(cfg, profile)
    )


def task_planner(planning: DictConfig, samples: PhaseSamples | None = None) -> MemoryPlanner:
    """A `MemoryPlanner` of `planning`'s model (a `planning_config`), with `samples` or, when
    None, one sample per phase from its datamodule."""
    if samples is None:
        samples = sample_batches(instantiate(planning.data))
    max_epochs, max_steps = _trainer_length(planning)
    return MemoryPlanner(
        planning.model,
        samples,
        bitsandbytes_optimizer=swap_bitsandbytes_optimizer(planning.model),
        max_epochs=max_epochs,
        max_steps=max_steps,
    )


def plan_task(
    cfg: DictConfig,
    profile: HardwareProfile,
    *,
    train_batch_size: int | None,
    val_batch_size: int | None,
    setup: RunSetup | None = None,
    with_remedies: bool = True,
    samples: PhaseSamples | None = None,
) -> MemoryPlan:
    """Plan `cfg`'s task on `profile`.

    A batch size of None is searched: the largest that fits the profile's budget (capped by the
    dataset's size), or 1 when nothing fits. Without a budget (CPU profile) every batch size
    must be given. `setup` defaults to the profile's own; `samples` to the datamodule's.
    """
    started = time.perf_counter()
    if setup is None:
        setup = profile_setup(cfg, profile)
    budget = None if profile.budget_gib is None else int(profile.budget_gib * GIB)
    if budget is None and (train_batch_size is None or val_batch_size is None):
        raise ValueError(
            f"profile {profile.name} has no memory budget, so batch sizes cannot be searched; "
            "give both batch sizes"
        )
    planning = planning_config(cfg, profile)
    optimizer = _optimizer_name(planning.model)
    planner = task_planner(planning, samples)
    samples = planner.samples

    def phase(
        name: str, requested: int | None, limit: int | None, upper_first: bool = False
    ) -> PhasePlan:
        if requested is not None:
            return planner.measure(name, requested, setup)
        _, plan = planner.largest_batch_size(
            name, setup, budget, limit or UNBOUNDED_BATCH, upper_first=upper_first
        )
        return plan

    train = phase(TRAIN, train_batch_size, samples.train_size)
    # Validation keeps the training state resident. When that state leaves room, a validation
    # set often fits whole: tracing its full size first then settles the search in one trace.
    val = phase(VAL, val_batch_size, samples.val_size, upper_first=_resident(train) < (budget or 0))
    # Inference holds no training state: the validation set fits whole more often still.
    inference = phase(INFERENCE, val_batch_size, samples.val_size, upper_first=True)
    remedies: list[Remedy] = []
    over = budget is not None and (train.peak > budget or val.peak > budget)
    if with_remedies and over:
        remedies = propose_remedies(planner, profile, setup, train, val, budget)
    return MemoryPlan(
        profile=profile,
        setup=setup,
        optimizer=optimizer,
        budget_bytes=budget,
        train=train,
        val=val,
        inference=inference,
        train_searched=train_batch_size is None,
        val_searched=val_batch_size is None,
        train_limit=samples.train_size,
        val_limit=samples.val_size,
        remedies=tuple(remedies),
        traces=planner.traces,
        seconds=time.perf_counter() - started,
        planner=planner,
    )
