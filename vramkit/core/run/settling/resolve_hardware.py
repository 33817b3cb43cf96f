"""Settle a run's hardware profile (from `+hw=<profile>` or detection): the deciding step of
`vramkit.core.run.settling.settle`.

`settle_profile` detects a profile when none was given, validates it, checks it against the
device, plans the run (and, when it does not fit, composes the automatic fit's remedy into a
config of its own), resolves "auto" batch sizes and the target effective batch, and returns all
of it as a value: the profile, the remedy, the lines that say why, and the records for the run
folder (`fit_decision.json`, `memory_plan.json`). It prints, logs and writes nothing, and leaves
the config it is given as it was: the run prints and records a settlement once it has decided
(`vramkit.core.run.train`).
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf, open_dict

from vramkit.core.config.source import command_line_overrides
from vramkit.core.hardware.detect import DeviceInfo, detect_profile, display_path, probe_device
from vramkit.core.hardware.device_check import (
    apply_memory_cap,
    check_memory_budget,
    check_profile,
)
from vramkit.core.hardware.profile import (
    HardwareProfile,
    ProfileError,
    ProfileSource,
    override_key,
    validate_profile,
)
from vramkit.core.planner.decisions.task_defaults import DEFAULTS_KEY, task_batch_default
from vramkit.core.planner.request import batch_size_request
from vramkit.core.run.settling.eval_batch import settle_eval_batch
from vramkit.core.units import GIB

if TYPE_CHECKING:
    from vramkit.core.planner.decisions.task_plan import MemoryPlan
    from vramkit.core.run.settling.fit_to_budget import BudgetOutcome

_DATA_DEFAULTS = (
    ("batch_size", "train"),
    ("val_batch_size", "val"),
)

ComposeWith = Callable[[Sequence[str]], DictConfig]
"""The config the user's overrides compose to with the given overrides appended."""

Lines = tuple[str, ...]
"""Decision lines, in the order they were taken (the run logs each as ``hw: <line>``)."""


class RemedyNeedsComposition(RuntimeError):
    """The automatic fit chose a remedy, and nothing was given to compose it into a config."""


@dataclasses.dataclass(frozen=True)
class SettledProfile:
    """What settling a config's hardware decided."""

    profile: HardwareProfile
    """The run's profile: "auto" batch sizes and accumulation resolved."""
    requested: RequestedProfile
    """The profile the decided config asks for (or the machine's, detected), before any device
    check: the user's config, or after an automatic fit the one composed with `remedy`."""
    remedy: tuple[str, ...]
    """The automatic fit's overrides, appended to the user's; () when none was applied."""
    lines: Lines
    """Each decision, for the console: detection, mapping, memory cap, fit, batch sizes."""
    remedy_record: dict[str, Any] | None
    """What the automatic fit decided and why when the plan did not fit (the run folder's
    `fit_decision.json`); None when the requested run fit or was not planned."""
    memory_plan: dict[str, Any] | None
    """The planner's predicted peaks at the settled batch sizes (the run folder's
    `memory_plan.json`, which report.html draws beside the measured ones); None when nothing
    was planned."""


def settle_profile(
    cfg: DictConfig,
    *,
    conf_dir: Path,
    device: DeviceInfo | None = None,
    plan_batches: bool = True,
    check_device: bool = True,
    compose_with: ComposeWith | None = None,
    plan_inference: bool = False,
) -> SettledProfile:
    """Settle the hardware profile of `cfg` (the user's composed config, left unchanged).

    Without `cfg.hw` (no `+hw=` given) the profile is detected from `device` (probed when None)
    and loaded from `conf_dir/hw/<name>.yaml`; `hw.*` keys given without a profile are merged on
    top. On a GPU profile with a model and data to plan (and `plan_batches` true) the memory
    planner plans the requested run: when it does not fit, `hw.fit: auto` takes the cheapest
    remedy that fits and settles the config `compose_with(remedy)` gives instead (raises
    `RemedyNeedsComposition` without `compose_with`); `hw.fit: off` refuses with the remedies
    listed; a GPU profile rehearsed on a CPU (`hw.strict=false`) only says what it would do.
    "auto" batch sizes then come from the planner (else, and on a CPU, from the task's stated
    defaults). Raises `ProfileError` for an invalid profile or missing data defaults,
    `HardwareMismatchError` when a strict profile does not fit the device, and the planner's
    `DoesNotFitError` when the run does not fit and is not fitted. With `check_device=False` the
    profile is settled for its own hardware (a preview, as `scripts/plan_memory.py
    --print-config` shows it): no device check and no memory cap. With `plan_inference`
    (eval.py) a GPU profile's `val_batch_size` is the inference plan's (`settle_eval_batch`).
    """
    cfg = copy.deepcopy(cfg)  # a detected profile is written into its hw node for the planner
    if check_device and device is None:
        device = probe_device()
    requested, profile, lines = _checked_profile(cfg, conf_dir, device, check_device)
    plan = None
    remedy: tuple[str, ...] = ()
    record = None
    target = _fit_target(cfg, requested.profile, profile) if plan_batches else None
    if target is not None:
        outcome, said = _plan_within_budget(cfg, target, rehearsal=profile.accelerator != "gpu")
        lines += said
        if outcome is not None:
            record = outcome.record()
            if outcome.applied:
                if compose_with is None:
                    raise RemedyNeedsComposition(
                        f"the automatic fit chose {' '.join(outcome.remedy)}, and this caller "
                        "gave no way to compose it: settle the config with "
                        "vramkit.core.run.settling.settle.settle"
                    )
                remedy = outcome.remedy
                cfg = compose_with(remedy)
                # The remedy's config: its profile settled again, its lines said already.
                requested, profile, _ = _checked_profile(cfg, conf_dir, device, check_device)
            elif profile.accelerator == "gpu":
                plan = outcome.plan

    memory_plan = None
    # A `cpu` profile's budget is the host's memory (a GPU profile rehearsed on a CPU plans its
    # GPU instead, above; the memory monitor's guard still watches its host).
    if plan_batches and check_device and requested.profile.accelerator == "cpu" and _plannable(cfg):
        profile, said, memory_plan = _sized_for_host_memory(cfg, profile, requested.source)
        lines += said
    if plan_batches:
        profile, said, predictions = _planned_batch_sizes(cfg, profile, plan)
        lines += said
        memory_plan = predictions or memory_plan
    if plan_inference and _plannable(cfg):
        profile, said = settle_eval_batch(cfg, profile, requested.source)
        lines += said
    profile, said = resolve_batch_sizes(profile, cfg, source=requested.source)
    lines += said
    if plan is not None:
        lines += _check_gpu_host_memory(cfg, profile, plan)
    return SettledProfile(profile, requested, remedy, lines, record, memory_plan)


def _checked_profile(
    cfg: DictConfig, conf_dir: Path, device: DeviceInfo | None, check_device: bool
) -> tuple[RequestedProfile, HardwareProfile, Lines]:
    """The requested profile, the one the run uses on `device` (mapped or capped), and the
    lines that say how."""
    requested = requested_profile(cfg, conf_dir=conf_dir, device=device)
    profile, source = requested.profile, requested.source
    lines = (requested.line,) if requested.line else ()
    if check_device:
        check_memory_budget(profile, device, source=source)
        fit = check_profile(profile, device, source=source, detected=requested.detected)
        if fit.problems:
            lines += (
                f"rehearsing {profile.name} on this machine (hw.strict=false; "
                f"{'; '.join(fit.problems)}): {fit.mapping()}",
            )
        if fit.memory_cap is not None:
            fraction = apply_memory_cap(fit.profile, device)
            lines += (_memory_cap_line(fit.profile, device, fraction),)
        profile = fit.profile
    return requested, profile, lines


def _fit_target(
    cfg: DictConfig, requested: HardwareProfile, running: HardwareProfile
) -> HardwareProfile | None:
    """The GPU profile to plan the requested run on: the one the run uses, or, on a CPU
    rehearsal, the requested one; None when there is nothing to plan."""
    target = running if running.accelerator == "gpu" else requested
    if target.accelerator != "gpu" or target.budget_gib is None or not _plannable(cfg):
        return None
    return target


def _sized_for_host_memory(
    cfg: DictConfig, profile: HardwareProfile, source: ProfileSource
) -> tuple[HardwareProfile, Lines, dict[str, Any] | None]:
    """A `cpu` profile whose batch sizes fit the host's memory ("auto" takes the largest up to
    the task's stated default that fits, a set size is checked), the lines that say so, and the
    host plan (`memory_plan.json`). Raises `DoesNotFitError` (with the remedies) when even
    batch size 1, or the set size, does not fit."""
    # Imported here, as for `_plan_within_budget`: the planner pulls in Lightning and fake tensors.
    from vramkit.core.planner import DoesNotFitError, PlanningError
    from vramkit.core.planner.decisions.host_memory import host_budget
    from vramkit.core.run.settling.fit_to_budget import size_for_host_memory

    budget = host_budget(profile.memory_budget_fraction, memory_gib=profile.memory_gib)
    if budget is None:
        return (
            profile,
            ("host memory unknown (no /proc/meminfo): the run is not checked against it",),
            None,
        )
    lines: Lines = ()
    if budget.capped_from is not None:
        lines += (
            f"warning: hw.memory_gib {budget.capped_from:g} ({source.where('memory_gib')}) is "
            f"more than this process can have now; planned within {budget.available / GIB:.2f} "
            "GiB instead (other processes hold the rest)",
        )
    asked = batch_size_request(profile)
    searched = asked.searched
    requested = [
        _data_default(cfg, data_key, field, source) if size is None else size
        for (field, data_key), size in zip(_DATA_DEFAULTS, asked.sizes, strict=True)
    ]
    try:
        sizing = size_for_host_memory(
            cfg,
            profile,
            budget,
            train_batch_size=requested[0],
            val_batch_size=requested[1],
            searched=searched,
            typed=_typed_override(),
        )
    except DoesNotFitError:
        raise
    except PlanningError as error:
        return (
            profile,
            (*lines, f"memory planner unavailable ({error}); host memory is not checked"),
            None,
        )
    lines += (sizing.line(),)
    sizes = (sizing.train.batch_size, sizing.val.batch_size)
    for (field, data_key), auto, wanted, size in zip(
        _DATA_DEFAULTS, searched, requested, sizes, strict=True
    ):
        if auto and size < wanted:
            lines += (
                f"{field} 'auto' takes {size}, the largest that fits the host's memory or the "
                f"dataset's size ({DEFAULTS_KEY}.{data_key} is {wanted})",
            )
    sized = profile.model_copy(update={"batch_size": sizes[0], "val_batch_size": sizes[1]})
    return sized, lines, sizing.predictions(profile)


def _check_gpu_host_memory(cfg: DictConfig, profile: HardwareProfile, plan: MemoryPlan) -> Lines:
    """Pinned batches, loader workers and DeepSpeed's offloaded state against the host's memory;
    the line that says what was planned. Raises `DoesNotFitError` with the remedies when they
    do not fit."""
    from vramkit.core.run.settling.fit_to_budget import check_gpu_host_memory

    sizing = check_gpu_host_memory(
        cfg,
        profile,
        plan,
        train_batch_size=int(profile.batch_size),
        val_batch_size=int(profile.val_batch_size),
        typed=_typed_override(),
    )
    return (sizing.line(),) if sizing is not None else ()


def _plannable(cfg: DictConfig) -> bool:
    """The config has a model and a datamodule to build (each with a `_target_`)."""
    return all(
        isinstance(cfg.get(key), DictConfig) and "_target_" in cfg[key] for key in ("model", "data")
    )


def _plan_within_budget(
    cfg: DictConfig, profile: HardwareProfile, *, rehearsal: bool
) -> tuple[BudgetOutcome | None, Lines]:
    # Imported here: the planner pulls in Lightning and fake tensors, which CPU runs never need.
    from vramkit.core.planner import DoesNotFitError, PlanningError
    from vramkit.core.run.settling.fit_to_budget import plan_within_budget

    try:
        outcome = plan_within_budget(cfg, profile, rehearsal=rehearsal, typed=_typed_override())
    except DoesNotFitError:
        raise
    except PlanningError as error:
        return None, (
            f"memory planner unavailable ({error}); the run is not checked against the budget",
        )
    return outcome, outcome.lines


def _typed_override() -> Callable[[str], str]:
    """Overrides as the user appends them: without `+hw=<profile>` Hydra has no `hw` node to
    change, so `+hw.key=…`, or `++hw.key=…` when the command adds that key already (Hydra
    refuses to add a key twice)."""
    plus_hw = HydraConfig.initialized() and _hydra_hw_context()[0] is None
    given = {override_key(o) for o in command_line_overrides()}

    def typed(override: str) -> str:
        if plus_hw and override.startswith("hw."):
            return ("++" if override_key(override) in given else "+") + override
        return override

    return typed


@dataclasses.dataclass(frozen=True)
class RequestedProfile:
    """The profile a config asks for, validated, before any device check or planning."""

    profile: HardwareProfile
    source: ProfileSource  # the file (and overrides) its values came from, for messages
    detected: bool  # True when no `+hw=` was given and the machine chose it
    line: str | None = None
    """How it was detected, for the console; None when it was given."""
    given: dict[str, Any] | None = None
    """The config's `hw` node as composed (resolved), before detection: the `+hw=` profile's
    values, only the `hw.*` keys given without one, or None."""
    values: dict[str, Any] | None = None
    """The values validated (resolved): `given`, or the detected profile's file with `given` on
    top."""


def requested_profile(
    cfg: DictConfig, *, conf_dir: Path, device: DeviceInfo | None = None
) -> RequestedProfile:
    """The `+hw=<name>` profile of `cfg`, or the one detected for `device` (probed when None).

    A detected profile (with any `hw.*` keys given on top) is written into `cfg.hw`, where the
    planner's interpolations read it. Raises `ProfileError` naming each bad key, its file and
    the command-line override that set it.
    """
    conf_dir = Path(conf_dir)
    hw_dir = conf_dir / "hw"
    display_root = conf_dir.parent
    choice, overrides = _hydra_hw_context()
    given = cfg.get("hw")
    composed = _values(given)
    detected = _needs_detection(given, choice)
    line = None
    if detected:
        detection = detect_profile(device or probe_device(), hw_dir, display_root=display_root)
        raw = detection.raw
        line = f"detected {detection.reason}"
        if given is not None:
            raw = OmegaConf.merge(raw, given)
            line += f"; hw keys given on top: {', '.join(str(key) for key in given)}"
        with open_dict(cfg):
            cfg.hw = raw
        source = ProfileSource(detection.source.file, overrides)
    else:
        source = ProfileSource(_profile_file(choice, given, hw_dir, display_root), overrides)
    profile = validate_profile(cfg.hw, source)
    return RequestedProfile(profile, source, detected, line, composed, _values(cfg.hw))


def _values(node: object) -> dict[str, Any] | None:
    return OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else None


def resolve_batch_sizes(
    profile: HardwareProfile, cfg: DictConfig, source: ProfileSource
) -> tuple[HardwareProfile, Lines]:
    """Replace "auto" batch sizes by the task's stated defaults and derive accumulation; return
    the profile and one line for each of the two decisions taken.

    "auto" takes `batch_size_defaults.train` / `batch_size_defaults.val` (positive ints);
    a set `target_effective_batch` gives accumulate_grad_batches =
    ceil(target / (batch_size × devices × num_nodes)).
    """
    lines: Lines = ()
    updates: dict[str, int] = {}
    asked = batch_size_request(profile)
    for (field, data_key), auto in zip(_DATA_DEFAULTS, asked.searched, strict=True):
        if auto:
            updates[field] = _data_default(cfg, data_key, field, source)
    if updates:
        taken = ", ".join(
            f"{field} {updates[field]} ({DEFAULTS_KEY}.{data_key})"
            for field, data_key in _DATA_DEFAULTS
            if field in updates
        )
        lines += (f"batch sizes 'auto' take the task's stated defaults: {taken}",)
    profile = profile.model_copy(update=updates)

    target = profile.target_effective_batch
    if target is None:
        return profile, lines
    per_step = profile.batch_size * profile.world_size
    accumulate = math.ceil(target / per_step)
    nodes = f" × {profile.num_nodes} nodes" if profile.num_nodes > 1 else ""
    line = (
        f"target_effective_batch {target} → accumulate_grad_batches {accumulate} "
        f"({profile.batch_size} per device × {profile.devices} device(s){nodes} × {accumulate} "
        f"= {per_step * accumulate})"
    )
    if profile.accumulate_grad_batches not in (1, accumulate):
        line += f"; replaces accumulate_grad_batches {profile.accumulate_grad_batches}"
    return profile.model_copy(update={"accumulate_grad_batches": accumulate}), (*lines, line)


def _planned_batch_sizes(
    cfg: DictConfig, profile: HardwareProfile, plan: MemoryPlan | None = None
) -> tuple[HardwareProfile, Lines, dict[str, Any] | None]:
    """A GPU profile with its "auto" batch sizes resolved by the memory planner (from `plan`
    when the requested run was planned already), the lines that say why, and the predicted
    peaks (`memory_plan.json`)."""
    wants_auto = batch_size_request(profile).any_searched
    if profile.accelerator != "gpu" or not wants_auto or not _plannable(cfg):
        return profile, (), None
    # Imported here: the planner pulls in Lightning and fake tensors, which CPU runs never need.
    from vramkit.core.planner import DoesNotFitError, PlanningError, resolve_auto_batch_sizes
    from vramkit.core.run.settling.plan_request_from_config import plan_request

    try:
        request = plan_request(cfg, profile, with_remedies=False)
        sizes = resolve_auto_batch_sizes(request, plan)
    except DoesNotFitError:
        raise
    except PlanningError as error:
        line = f"memory planner unavailable ({error}); 'auto' takes the task's stated defaults"
        return profile, (line,), None
    planned = profile.model_copy(
        update={
            "batch_size": sizes.train,
            "val_batch_size": sizes.val,
            "accumulate_grad_batches": sizes.accumulate,
        }
    )
    return planned, sizes.lines, sizes.predictions


def _data_default(cfg: DictConfig, data_key: str, field: str, source: ProfileSource) -> int:
    value = task_batch_default(cfg, data_key)
    if value is None:
        raise ProfileError(
            f"hw.{field} is 'auto' ({source.where(field)}) but the task config has no "
            f"{DEFAULTS_KEY}.{data_key}: set hw.{field}=<int> or {DEFAULTS_KEY}.{data_key}=<int>",
            keys=(field,),
        )
    return value


def _needs_detection(given: object, choice: str | None) -> bool:
    # A `hw` node without a name holds only `+hw.key=value` overrides (or an experiment's hw
    # keys): they refine the detected profile. Under Hydra, a chosen `+hw=` file is never
    # replaced, even when it lacks a name; validation reports that instead.
    if given is None:
        return True
    if choice is not None:
        return False
    return isinstance(given, DictConfig) and "name" not in given


def _hydra_hw_context() -> tuple[str | None, tuple[str, ...]]:
    """The `+hw=` choice and the command-line overrides of `hw…`, when running under Hydra."""
    if not HydraConfig.initialized():
        return None, ()
    hydra_cfg = HydraConfig.get()
    choice = hydra_cfg.runtime.choices.get("hw")
    overrides = tuple(
        o
        for o in command_line_overrides()
        if override_key(o) == "hw" or override_key(o).startswith("hw.")
    )
    return choice, overrides


def _profile_file(choice: str | None, given: object, hw_dir: Path, display_root: Path) -> str:
    """The file the user's profile came from, as they would type it ("conf/hw/t4.yaml")."""
    name = choice
    if name is None and isinstance(given, DictConfig):
        name = given.get("name")
    if isinstance(name, str):
        path = hw_dir / f"{name}.yaml"
        if path.is_file():
            return display_path(path, display_root)
        if choice is not None:
            return f"hw profile '{choice}' from Hydra's search path"
    return "the hw config"


def _memory_cap_line(profile: HardwareProfile, device: DeviceInfo, fraction: float | None) -> str:
    head = (
        f"warning: this GPU ({device.describe()}) has more memory than profile "
        f"{profile.name}'s {profile.memory_gib:.1f} GiB"
    )
    if fraction is None:
        return f"{head}; CUDA is not available in this process, so no memory cap was set"
    return (
        f"{head}; capping this process at {fraction:.1%} of its memory so the run behaves "
        f"as on {profile.label}"
    )
