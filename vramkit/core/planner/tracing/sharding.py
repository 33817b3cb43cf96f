"""Per-device memory of a data-parallel run: the traced categories, sharded by the strategy.

The trace sees one process holding the whole model. A run on N = `devices × num_nodes`
processes keeps a strategy-dependent share of the model states on each device; activations
belong to each process's own batch and stay as traced. With Ψ parameters and the traced
parameter, gradient and optimizer-state bytes P, G and S at the peak:

- DDP: P, G and S whole, plus the reducer's gradient buckets. `Reducer::initialize_buckets`
  (torch/csrc/distributed/c10d/reducer.cpp) allocates one flat `bucket.gradients` tensor per
  bucket, together as large as every trainable parameter's gradient, and keeps them for the
  run; `DistributedDataParallel(gradient_as_bucket_view=False)` is torch's default
  (torch/nn/parallel/distributed.py) and Lightning's `DDPStrategy` passes only the kwargs it is
  given (lightning/pytorch/strategies/ddp.py), so gradients exist twice. With
  `gradient_as_bucket_view: true` the gradients are views into the buckets (counted once; the
  `DistributedDataParallel` docs: "the saved memory size will be equal to the total gradients
  size").
  Buckets hold `bucket_cap_mb` = 25 MiB each (the first 1 MiB,
  `dist._DEFAULT_FIRST_BUCKET_BYTES`).
- FSDP (torch/distributed/fsdp, Lightning's `FSDPStrategy`): FULL_SHARD keeps P/N, G/N and
  S/N (flat parameters padded to a multiple of N), and materialises a wrapped unit's whole
  parameters in `param_dtype` while it computes: with the default `BACKWARD_PRE` prefetch two
  units are gathered in backward, one in forward. Lightning's `FSDPPrecision` sets `param_dtype`
  and `reduce_dtype` to fp16 for 16-mixed, bf16 for bf16-mixed (lightning/pytorch/plugins/
  precision/fsdp.py); a unit's unsharded gradients live in `reduce_dtype` until reduce-scattered.
  Without `auto_wrap_policy` (conf/trainer/fsdp.yaml sets none) the root is the only unit: the
  whole model is gathered for the whole step. SHARD_GRAD_OP keeps parameters gathered from
  forward to the end of backward; NO_SHARD is DDP.
- DeepSpeed ZeRO (Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training Trillion
  Parameter Models", Fig. 1; DeepSpeed's engine halves the model when fp16/bf16 is enabled, so
  the trace follows "16-true" / "bf16-true": `traced_precision`):
  16-bit parameters 2Ψ, 16-bit gradients 2Ψ and KΨ of optimizer states (K = 12 for
  mixed-precision Adam: fp32 master weights 4Ψ, momentum 4Ψ, variance 4Ψ). Stage 2 keeps
  2Ψ + (2 + K)Ψ/N, stage 3 (2 + 2 + K)Ψ/N (stage 1 would be 2Ψ + 2Ψ + KΨ/N). Here KΨ is the
  traced optimizer state in fp32 plus the fp32 master weights, so an optimizer without moments
  (SGD) gets its own K. Stage 2 keeps two `reduce_bucket_size` buffers during backward
  (contiguous_gradients with overlap_comm: DeepSpeed's runtime/zero/stage_1_and_2.py
  `ipg_buffer`), stage 3 one. Stage 3 gathers the largest module's parameters plus
  `stage3_prefetch_bucket_size`, at most `stage3_max_live_parameters`, and keeps parameters
  under `stage3_param_persistence_threshold` elements whole on every device (DeepSpeed's
  configuration docs, "ZeRO Optimizations for FP16 Training", defaults 1e9, 5e7 and 1e5).
  Lightning's `DeepSpeedStrategy` sets reduce and all-gather buckets of 2e8 elements
  (lightning/pytorch/strategies/deepspeed.py). Offloading the optimizer keeps its state, the
  master weights and the gradient partitions in host memory (the planner traces that with
  `optimizer_layouts.ZeroStage2Layout`, which also drops the device-side optimizer step's
  temporaries; `shard_allocated` states the same arithmetic); offloading parameters (stage 3)
  keeps the parameter partitions there.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from torch import nn

from vramkit.core.planner.errors import PlanningError
from vramkit.core.planner.tracing.recorder import GRADIENTS, OPTIMIZER_STATE, PARAMETERS

SINGLE = "single"
DDP = "ddp"
FSDP = "fsdp"
ZERO2 = "deepspeed_zero2"
ZERO2_OFFLOAD = "deepspeed_zero2_offload"
ZERO3 = "deepspeed_zero3"
ZERO3_OFFLOAD = "deepspeed_zero3_offload"
STRATEGIES = (SINGLE, DDP, FSDP, ZERO2, ZERO2_OFFLOAD, ZERO3, ZERO3_OFFLOAD)
DEEPSPEED = (ZERO2, ZERO2_OFFLOAD, ZERO3, ZERO3_OFFLOAD)

MIB = 2**20
DDP_BUCKET_CAP_MB = 25
"""torch's `_DEFAULT_BUCKET_CAP_MB` (torch/nn/parallel/distributed.py)."""
DDP_FIRST_BUCKET_BYTES = 1 * MIB
"""`dist._DEFAULT_FIRST_BUCKET_BYTES`: the first bucket is small so its all-reduce starts early."""
DEEPSPEED_REDUCE_BUCKET = 200_000_000
"""Elements of Lightning's `DeepSpeedStrategy(reduce_bucket_size=…)` default."""
STAGE3_MAX_LIVE_PARAMETERS = 1_000_000_000
"""DeepSpeed's default `stage3_max_live_parameters` (Lightning does not set it)."""
STAGE3_PREFETCH_BUCKET = 50_000_000
"""DeepSpeed's default `stage3_prefetch_bucket_size` (elements)."""
STAGE3_PERSISTENCE_THRESHOLD = 100_000
"""DeepSpeed's default `stage3_param_persistence_threshold` (elements)."""
_ALLOCATION_ROUND = 512  # the caching allocator's block rounding (cuda_rules)

_SIXTEEN_BIT = ("16-mixed", "bf16-mixed", "16-true", "bf16-true")


@dataclass(frozen=True)
class Sharding:
    """How a run spreads its model states over `world_size` processes (one per device)."""

    strategy: str = SINGLE
    world_size: int = 1
    gradient_as_bucket_view: bool = False
    """DDP: gradients are views into the reducer's buckets instead of separate tensors."""
    bucket_cap_mb: float = DDP_BUCKET_CAP_MB
    """DDP: bytes per gradient bucket (MiB)."""
    sharding_strategy: str = "FULL_SHARD"
    """FSDP: FULL_SHARD, SHARD_GRAD_OP or NO_SHARD."""
    wrap_classes: tuple[str, ...] = ()
    """FSDP: class names the auto-wrap policy makes units of; () wraps only the root."""
    cpu_offload: bool = False
    """FSDP: sharded parameters, gradients and the optimizer step in host memory."""
    reduce_bucket_size: int = DEEPSPEED_REDUCE_BUCKET
    """DeepSpeed: elements per gradient reduce bucket."""

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ValueError(f"unknown strategy {self.strategy!r}; one of {STRATEGIES}")
        if self.world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {self.world_size}")

    @property
    def sharded(self) -> bool:
        """The plan differs from the single-device trace."""
        return self.strategy != SINGLE

    @property
    def label(self) -> str:
        """How the plan names the strategy, e.g. "DeepSpeed ZeRO-2"."""
        names = {
            SINGLE: "one device",
            DDP: "DDP",
            FSDP: f"FSDP {self.sharding_strategy}",
            ZERO2: "DeepSpeed ZeRO-2",
            ZERO2_OFFLOAD: "DeepSpeed ZeRO-2 + CPU optimizer offload",
            ZERO3: "DeepSpeed ZeRO-3",
            ZERO3_OFFLOAD: "DeepSpeed ZeRO-3 + CPU parameter offload",
        }
        return names[self.strategy]


ONE_DEVICE = Sharding()
"""One process holding everything: the trace as it is."""


@dataclass(frozen=True)
class ModelStates:
    """What the sharding arithmetic needs to know of a model (elements and traced bytes)."""

    parameters: int
    """Elements of every parameter (Ψ)."""
    trainable: int
    """Elements of the parameters that get gradients."""
    parameter_bytes: int
    """Bytes of every parameter as traced (its dtype under the run's precision)."""
    trainable_bytes: int
    """Bytes of the trainable parameters as traced."""
    largest_unit: int
    """Elements of the largest FSDP unit (the whole model without a wrap policy)."""
    largest_two_units: int
    """Elements of the two largest FSDP units together (backward prefetches the next unit)."""
    largest_module: int
    """Elements of the largest module's own parameters (what ZeRO-3 gathers to run it)."""
    persistent: int
    """Elements of parameters ZeRO-3 keeps whole (under its persistence threshold)."""

    @property
    def traced_element_size(self) -> float:
        """Bytes per parameter element as traced (4.0 under fp32 weights)."""
        return self.parameter_bytes / self.parameters if self.parameters else 4.0


def model_states(module: nn.Module, wrap_classes: Iterable[str] = ()) -> ModelStates:
    """Count `module`'s parameters (fake or real) for `shard_allocated`."""
    params = list(module.parameters())
    wrapped = set(wrap_classes)
    units = _unit_sizes(module, wrapped) if wrapped else [sum(p.numel() for p in params)]
    units.sort(reverse=True)
    own = [sum(p.numel() for p in child.parameters(recurse=False)) for child in module.modules()]
    return ModelStates(
        parameters=sum(p.numel() for p in params),
        trainable=sum(p.numel() for p in params if p.requires_grad),
        parameter_bytes=sum(p.numel() * p.element_size() for p in params),
        trainable_bytes=sum(p.numel() * p.element_size() for p in params if p.requires_grad),
        largest_unit=units[0] if units else 0,
        largest_two_units=sum(units[:2]),
        largest_module=max(own, default=0),
        persistent=sum(p.numel() for p in params if p.numel() < STAGE3_PERSISTENCE_THRESHOLD),
    )


def _unit_sizes(module: nn.Module, wrapped: set[str]) -> list[int]:
    """Elements of each FSDP unit: every module of a wrapped class, and the root; a unit owns its
    parameters minus those of the units nested in it."""
    sizes: list[int] = []

    def visit(node: nn.Module) -> int:
        owned = sum(p.numel() for p in node.parameters(recurse=False))
        for child in node.children():
            inner = visit(child)
            if type(child).__name__ in wrapped:
                sizes.append(inner)
            else:
                owned += inner
        return owned

    sizes.append(visit(module))
    return sizes


def traced_precision(sharding: Sharding, precision: str) -> str:
    """The precision whose semantics a trace of this run follows.

    DeepSpeed runs "16-mixed" / "bf16-mixed" without autocast: Lightning's `DeepSpeedPrecision`
    has no autocast `forward_context` and converts the inputs, and DeepSpeed's engine converts
    the module to the 16-bit dtype; that is Lightning's "16-true" / "bf16-true" (no weight-cast
    cache, 16-bit activations). The fp32 master weights are added by `shard_allocated`.
    """
    if sharding.strategy in DEEPSPEED:
        return {"16-mixed": "16-true", "bf16-mixed": "bf16-true"}.get(precision, precision)
    return precision


def sixteen_bit(precision: str) -> bool:
    """Whether DeepSpeed/FSDP compute with 16-bit parameters under Lightning's `precision`."""
    return precision in _SIXTEEN_BIT


def row_notes(sharding: Sharding) -> dict[str, str]:
    """What each model-state row of a per-device plan holds, e.g. {"gradients": "1/4 + buckets"}."""
    n = f"1/{sharding.world_size}"
    strategy = sharding.strategy
    if strategy == SINGLE:
        return {}
    if strategy == DDP or (strategy == FSDP and sharding.sharding_strategy == "NO_SHARD"):
        view = "as bucket views" if sharding.gradient_as_bucket_view else "+ bucket copies"
        return {PARAMETERS: "replica", GRADIENTS: view, OPTIMIZER_STATE: "replica"}
    if strategy == FSDP:
        return {
            PARAMETERS: f"{n} + gathered units",
            GRADIENTS: f"{n} + a unit's unsharded",
            OPTIMIZER_STATE: n,
        }
    offloaded = strategy == ZERO2_OFFLOAD
    state = "in host memory" if offloaded else f"{n}, fp32 + master"
    gradients = "buckets" if offloaded else f"{n} + buckets"
    parameters = "whole" if strategy in (ZERO2, ZERO2_OFFLOAD) else f"{n} + gathered"
    return {PARAMETERS: parameters, GRADIENTS: gradients, OPTIMIZER_STATE: state}


def _round(nbytes: float) -> int:
    return math.ceil(nbytes / _ALLOCATION_ROUND) * _ALLOCATION_ROUND if nbytes > 0 else 0


def ddp_bucket_bytes(states: ModelStates, bucket_cap_mb: float = DDP_BUCKET_CAP_MB) -> int:
    """Device bytes of DDP's gradient buckets: every trainable gradient once, in buckets of
    `bucket_cap_mb` MiB after a first bucket of 1 MiB, each block rounded to 512 B."""
    remaining = states.trainable_bytes
    if remaining == 0:
        return 0
    first = min(remaining, DDP_FIRST_BUCKET_BYTES)
    total = _round(first)
    remaining -= first
    cap = int(bucket_cap_mb * MIB)
    while remaining > 0:
        bucket = min(remaining, cap)
        total += _round(bucket)
        remaining -= bucket
    return total


def shard_allocated(
    allocated: Mapping[str, int],
    states: ModelStates,
    sharding: Sharding,
    precision: str,
    *,
    backward: bool,
) -> dict[str, int]:
    """The per-device bytes of each category under `sharding`, from the traced `allocated`.

    `allocated` is one device's trace at the peak (parameters, gradients, optimizer state,
    inputs, activations); `backward` says the phase runs a backward pass (training). Only the
    model states change: activations and inputs are the per-device batch's.
    """
    result = dict(allocated)
    strategy, n = sharding.strategy, sharding.world_size
    params, grads, state = (allocated[k] for k in (PARAMETERS, GRADIENTS, OPTIMIZER_STATE))
    if strategy == FSDP and sharding.sharding_strategy == "NO_SHARD":
        strategy = DDP  # a replica per device with all-reduced gradients
    if strategy == SINGLE:
        return result
    traced_size = states.traced_element_size
    if strategy == DDP:
        buckets = ddp_bucket_bytes(states, sharding.bucket_cap_mb)
        result[GRADIENTS] = (
            max(grads, buckets) if sharding.gradient_as_bucket_view else (grads + buckets)
        )
        return result
    if strategy == FSDP:
        return _fsdp(result, states, sharding, precision, params, grads, state, backward)
    # DeepSpeed: the engine converts the module to the 16-bit dtype when fp16/bf16 is enabled.
    size = 2 if sixteen_bit(precision) else 4
    scale = size / traced_size
    # Adam's moments in fp32 whatever the weights (DeepSpeed's optimizer runs on fp32 master
    # weights), plus those master weights when the weights are 16-bit.
    fp32_state = state * 4 / traced_size
    master = 4 * states.trainable if size == 2 and state > 0 else 0
    offload_optimizer = strategy == ZERO2_OFFLOAD
    result[OPTIMIZER_STATE] = 0 if offload_optimizer else _round((fp32_state + master) / n)
    stage3 = strategy in (ZERO3, ZERO3_OFFLOAD)
    buckets = (1 if stage3 else 2) * sharding.reduce_bucket_size * size
    gradient_partition = 0 if offload_optimizer else _round(grads * scale / n)
    # The buckets are allocated for each backward pass (stage_1_and_2.py `backward`): training.
    result[GRADIENTS] = gradient_partition + (buckets if backward else 0)
    if not stage3:
        result[PARAMETERS] = _round(params * scale)
        return result
    # ZeRO-3: small parameters stay whole; the rest is partitioned (or in host memory) and
    # gathered module by module, with a prefetch bucket, at most max_live_parameters at once.
    persistent = states.persistent * size
    partitioned = (states.parameters - states.persistent) * size
    kept = 0 if strategy == ZERO3_OFFLOAD else math.ceil(partitioned / n)
    gathered_elements = min(
        STAGE3_MAX_LIVE_PARAMETERS,
        states.largest_module + STAGE3_PREFETCH_BUCKET,
        states.parameters - states.persistent,
    )
    result[PARAMETERS] = _round(persistent + kept + gathered_elements * size)
    return result


def _fsdp(
    result: dict[str, int],
    states: ModelStates,
    sharding: Sharding,
    precision: str,
    params: int,
    grads: int,
    state: int,
    backward: bool,
) -> dict[str, int]:
    n = sharding.world_size
    compute_size = 2 if sixteen_bit(precision) else 4
    unit = states.largest_unit
    if sharding.sharding_strategy == "SHARD_GRAD_OP" and backward:
        gathered = states.parameters  # not resharded between forward and backward
    else:
        # Forward gathers one unit at a time; backward prefetches the next (BACKWARD_PRE).
        gathered = states.largest_two_units if backward else unit
    kept_params = 0 if sharding.cpu_offload else math.ceil(params / n)
    result[PARAMETERS] = _round(kept_params + gathered * compute_size)
    kept_grads = 0 if sharding.cpu_offload else math.ceil(grads / n)
    unsharded_grads = unit * compute_size if backward else 0
    result[GRADIENTS] = _round(kept_grads + unsharded_grads)
    result[OPTIMIZER_STATE] = 0 if sharding.cpu_offload else _round(state / n)
    return result


def sharding_of(trainer: Mapping[str, Any] | None, world_size: int) -> Sharding:
    """The `Sharding` a composed `trainer` config asks for on `world_size` processes.

    `trainer.strategy` is a Lightning strategy name ("ddp", "fsdp", "deepspeed_stage_2", …,
    "auto") or a `_target_` node of `DDPStrategy`, `FSDPStrategy` or `DeepSpeedStrategy`.
    "auto" (and no strategy) is one device's plan on one process and DDP on more, as Lightning
    chooses.
    """
    strategy = (trainer or {}).get("strategy") or "auto"
    if isinstance(strategy, str):
        return _named(strategy, world_size)
    target = str(strategy.get("_target_", ""))
    name = target.rsplit(".", 1)[-1]
    if name == "DDPStrategy":
        return Sharding(
            DDP,
            world_size,
            gradient_as_bucket_view=bool(strategy.get("gradient_as_bucket_view") or False),
            bucket_cap_mb=float(strategy.get("bucket_cap_mb") or DDP_BUCKET_CAP_MB),
        )
    if name == "FSDPStrategy":
        how = str(strategy.get("sharding_strategy") or "FULL_SHARD")
        if how not in _FSDP_PLANNED:
            # HYBRID_SHARD shards within a node only: the world size is not what divides.
            raise PlanningError(
                f"the planner plans FSDP sharding_strategy {', '.join(_FSDP_PLANNED)}, not {how!r}"
            )
        return Sharding(
            FSDP,
            world_size,
            sharding_strategy=how,
            wrap_classes=_wrap_classes(strategy.get("auto_wrap_policy")),
            cpu_offload=bool(strategy.get("cpu_offload") or False),
        )
    if name == "DeepSpeedStrategy":
        stage = int(strategy.get("stage", 2))
        if stage == 3:
            offload = bool(strategy.get("offload_parameters") or False)
            chosen = ZERO3_OFFLOAD if offload else ZERO3
        elif stage == 2:
            chosen = ZERO2_OFFLOAD if strategy.get("offload_optimizer") else ZERO2
        else:
            raise PlanningError(f"the planner plans DeepSpeed stages 2 and 3, not stage {stage}")
        bucket = strategy.get("reduce_bucket_size") or DEEPSPEED_REDUCE_BUCKET
        return Sharding(chosen, world_size, reduce_bucket_size=int(bucket))
    raise PlanningError(f"the planner does not know the strategy {target!r}")


_FSDP_PLANNED = ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD")

_NAMED = {
    "ddp": DDP,
    "ddp_spawn": DDP,
    "ddp_fork": DDP,
    "ddp_notebook": DDP,
    "ddp_find_unused_parameters_true": DDP,
    "fsdp": FSDP,
    "deepspeed": ZERO2,  # Lightning's registry: DeepSpeedStrategy() is stage 2
    "deepspeed_stage_2": ZERO2,
    "deepspeed_stage_2_offload": ZERO2_OFFLOAD,
    "deepspeed_stage_3": ZERO3,
    "deepspeed_stage_3_offload": ZERO3_OFFLOAD,
}


def _named(name: str, world_size: int) -> Sharding:
    if name in ("auto", "single_device"):
        return Sharding(DDP if world_size > 1 else SINGLE, world_size)
    if name == "fsdp_cpu_offload":
        return Sharding(FSDP, world_size, cpu_offload=True)
    if name not in _NAMED:
        raise PlanningError(f"the planner does not know the strategy {name!r}")
    return Sharding(_NAMED[name], world_size)


def _wrap_classes(policy: Any) -> tuple[str, ...]:
    """Class names of an `auto_wrap_policy` given as classes or dotted names; () otherwise."""
    if policy is None or isinstance(policy, str) or not isinstance(policy, Iterable):
        return ()
    names = []
    for entry in policy:
        name = entry if isinstance(entry, str) else getattr(entry, "__name__", "")
        if name:
            names.append(name.rsplit(".", 1)[-1])
    return tuple(names)
