"""Settle `cfg.hw` (from `+hw=<profile>` or detection) into the settings a run uses.

`resolve_hardware` is the engine of `vramkit.core.run.settle`: it detects a profile when none was
given, validates it, checks it against the device, plans the run (and, when it does not fit,
composes the automatic fit's remedy into a config of its own), resolves "auto" batch sizes and
the target effective batch, and writes the final values into the config's `hw` node, which the
trainer and data configs read as plain interpolations (`${hw.precision}`, `${hw.batch_size}`, …).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from hydra.core.hydra_config import HydraConfig
from lightning.fabric.utilities.rank_zero import rank_zero_only
from omegaconf import DictConfig, OmegaConf, open_dict

from vramkit.core.config.source import command_line_overrides
from vramkit.core.hardware.detect import DeviceInfo, detect_profile, display_path, probe_device
from vramkit.core.hardware.device_check import (
    apply_memory_cap,
    check_memory_budget,
    check_profile,
)
from vramkit.core.hardware.profile import (
    AUTO,
    HardwareProfile,
    ProfileError,
    ProfileSource,
    override_key,
    validate_profile,
)
from vramkit.core.planner.decisions.task_defaults import DEFAULTS_KEY, task_batch_default
from vramkit.core.run.eval_batch import settle_eval_batch
from vramkit.core.run.run_folder import RUN_CONFIG, record_name
from vramkit.core.units import GIB

if TYPE_CHECKING:
    from vramkit.core.planner.decisions.task_plan import MemoryPlan
    from vramkit.core.run.fit_to_budget import FitOutcome

_DATA_DEFAULTS = (
    ("batch_size", "train"),
    ("val_batch_size", "val"),
)

log = logging.getLogger(__name__)

ComposeWith = Callable[[Sequence[str]], DictConfig]
"""The config the user's overrides compose to with the given overrides appended."""


class RemedyNeedsComposition(RuntimeError):
    """The automatic fit chose a remedy, and nothing was given to compose it into a config."""


@dataclasses.dataclass(frozen=True)
class SettledHardware:
    """What settling a config's hardware decided, and the config it was decided on."""

    profile: HardwareProfile
    """The run's profile: "auto" batch sizes and accumulation resolved."""
    requested: RequestedProfile
    """The profile the config asked for (or the machine's, detected), before any device check."""
    config: DictConfig
    """The config settled, its `hw` node holding `profile`: the one given or, after an automatic
    fit, the one composed with `remedy` appended."""
    remedy: tuple[str, ...]
    """The automatic fit's overrides composed into `config`; () when none was applied."""


def resolve_hardware(
    cfg: DictConfig,
    *,
    conf_dir: Path,
    device: DeviceInfo | None = None,
    plan_batches: bool = True,
    check_device: bool = True,
    fit_records: list[dict] | None = None,
    compose_with: ComposeWith | None = None,
    plan_inference: bool = False,
) -> SettledHardware:
    """Settle the run's hardware profile and write it into `cfg.hw` (or, after an automatic fit,
    into the config composed with the remedy); return what was settled.

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
    `DoesNotFitError` when the run does not fit and is not fitted. Logs one line for each
    decision it takes (detection, mapping, memory cap, fit, auto batch sizes, accumulation).
    With `check_device=False` the profile is settled for its own hardware (a preview, as
    `scripts/plan_memory.py --print-config` shows it): no device check and no memory cap. When
    the plan did not fit, what the fit decided is appended to `fit_records` (the contents of
    the run folder's `fit_decision.json`). With `plan_inference` (eval.py) a GPU profile's
    `val_batch_size` is the inference plan's (`settle_eval_batch`).
    """
    if check_device and device is None:
        device = probe_device()
    requested, profile = _checked_profile(cfg, conf_dir, device, check_device)
    plan = None
    remedy: tuple[str, ...] = ()
    target = _fit_target(cfg, requested.profile, profile) if plan_batches else None
    if target is not None:
        outcome = _fit(cfg, target, rehearsal=profile.accelerator != "gpu")
        if outcome is not None:
            record = outcome.record()
            if record is not None and fit_records is not None:
                fit_records.append(record)
            if outcome.applied:
                if compose_with is None:
                    raise RemedyNeedsComposition(
                        f"the automatic fit chose {' '.join(outcome.remedy)}, and this caller "
                        "gave no way to compose it: settle the config with "
                        "vramkit.core.run.settle.settle"
                    )
                remedy = outcome.remedy
                cfg = compose_with(remedy)
                # The remedy's config: settle its profile again, quietly.
                requested, profile = _checked_profile(
                    cfg, conf_dir, device, check_device, echo=False
                )
            elif profile.accelerator == "gpu":
                plan = outcome.plan

    # A `cpu` profile's budget is the host's memory (a GPU profile rehearsed on a CPU plans its
    # GPU instead, above; the memory monitor's guard still watches its host).
    if plan_batches and check_device and requested.profile.accelerator == "cpu" and _plannable(cfg):
        profile = _fit_host_memory(cfg, profile, requested.source)
    planned = _planned_batch_sizes(cfg, profile, plan) if plan_batches else profile
    if plan_inference and _plannable(cfg):
        planned = settle_eval_batch(cfg, planned, requested.source, echo=_echo)
    resolved = resolve_batch_sizes(planned, cfg, source=requested.source)
    if plan is not None:
        _check_gpu_host_memory(cfg, resolved, plan)
    with open_dict(cfg):
        cfg.hw = resolved.model_dump()
    return SettledHardware(resolved, requested, cfg, remedy)


def _checked_profile(
    cfg: DictConfig,
    conf_dir: Path,
    device: DeviceInfo | None,
    check_device: bool,
    *,
    echo: bool = True,
) -> tuple[RequestedProfile, HardwareProfile]:
    """The requested profile, and the one the run uses on `device` (mapped or capped)."""
    requested = requested_profile(cfg, conf_dir=conf_dir, device=device, echo=echo)
    profile, source = requested.profile, requested.source
    if check_device:
        check_memory_budget(profile, device, source=source)
        fit = check_profile(profile, device, source=source, detected=requested.detected)
        if fit.problems and echo:
            _echo(
                f"rehearsing {profile.name} on this machine (hw.strict=false; "
                f"{'; '.join(fit.problems)}): {fit.mapping()}"
            )
        if fit.memory_cap is not None:
            fraction = apply_memory_cap(fit.profile, device)
            if echo:
                _echo(_memory_cap_line(fit.profile, device, fraction))
        profile = fit.profile
    return requested, profile


def _fit_target(
    cfg: DictConfig, requested: HardwareProfile, running: HardwareProfile
) -> HardwareProfile | None:
    """The GPU profile to plan the requested run on: the one the run uses, or, on a CPU
    rehearsal, the requested one; None when there is nothing to plan."""
    target = running if running.accelerator == "gpu" else requested
    if target.accelerator != "gpu" or target.budget_gib is None or not _plannable(cfg):
        return None
    return target


def _fit_host_memory(
    cfg: DictConfig, profile: HardwareProfile, source: ProfileSource
) -> HardwareProfile:
    """A `cpu` profile whose batch sizes fit the host's memory: "auto" takes the largest up to
    the task's stated default that fits, a set size is checked. Raises `DoesNotFitError` (with
    the remedies) when even batch size 1, or the set size, does not fit."""
    # Imported here, as for `_fit`: the planner pulls in Lightning and fake tensors.
    from vramkit.core.planner import DoesNotFitError, PlanningError
    from vramkit.core.planner.decisions.host_memory import host_budget
    from vramkit.core.run.fit_to_budget import fit_host_memory

    budget = host_budget(profile.memory_budget_fraction, memory_gib=profile.memory_gib)
    if budget is None:
        _echo("host memory unknown (no /proc/meminfo): the run is not checked against it")
        return profile
    if budget.capped_from is not None:
        _echo(
            f"warning: hw.memory_gib {budget.capped_from:g} ({source.where('memory_gib')}) is "
            f"more than this process can have now; planned within {budget.available / GIB:.2f} "
            "GiB instead (other processes hold the rest)"
        )
    searched = (profile.batch_size == AUTO, profile.val_batch_size == AUTO)
    requested = [
        _data_default(cfg, data_key, field, source) if auto else getattr(profile, field)
        for (field, data_key), auto in zip(_DATA_DEFAULTS, searched, strict=True)
    ]
    typed = _typed_override(HydraConfig.initialized() and _hydra_hw_context()[0] is None)
    try:
        fit = fit_host_memory(
            cfg,
            profile,
            budget,
            train_batch_size=requested[0],
            val_batch_size=requested[1],
            searched=searched,
            typed=typed,
        )
    except DoesNotFitError:
        raise
    except PlanningError as error:
        _echo(f"memory planner unavailable ({error}); host memory is not checked")
        return profile
    _echo(fit.line())
    sizes = (fit.train.batch_size, fit.val.batch_size)
    for (field, data_key), auto, wanted, size in zip(
        _DATA_DEFAULTS, searched, requested, sizes, strict=True
    ):
        if auto and size < wanted:
            _echo(
                f"{field} 'auto' takes {size}, the largest that fits the host's memory or the "
                f"dataset's size ({DEFAULTS_KEY}.{data_key} is {wanted})"
            )
    _write_memory_plan(cfg, fit.predictions(profile))
    return profile.model_copy(update={"batch_size": sizes[0], "val_batch_size": sizes[1]})


def _check_gpu_host_memory(cfg: DictConfig, profile: HardwareProfile, plan: MemoryPlan) -> None:
    """Pinned batches, loader workers and DeepSpeed's offloaded state against the host's memory;
    raises `DoesNotFitError` with the remedies when they do not fit."""
    from vramkit.core.run.fit_to_budget import check_gpu_host_memory

    typed = _typed_override(HydraConfig.initialized() and _hydra_hw_context()[0] is None)
    fit = check_gpu_host_memory(
        cfg,
        profile,
        plan,
        train_batch_size=int(profile.batch_size),
        val_batch_size=int(profile.val_batch_size),
        typed=typed,
    )
    if fit is not None:
        _echo(fit.line())


def _plannable(cfg: DictConfig) -> bool:
    """The config has a model and a datamodule to build (each with a `_target_`)."""
    return all(
        isinstance(cfg.get(key), DictConfig) and "_target_" in cfg[key] for key in ("model", "data")
    )


def _fit(cfg: DictConfig, profile: HardwareProfile, *, rehearsal: bool) -> FitOutcome | None:
    # Imported here: the planner pulls in Lightning and fake tensors, which CPU runs never need.
    from vramkit.core.planner import DoesNotFitError, PlanningError
    from vramkit.core.run.fit_to_budget import fit_to_budget

    # Without `+hw=<profile>` Hydra has no `hw` node to change: the user types `+hw.key=…`.
    typed = _typed_override(HydraConfig.initialized() and _hydra_hw_context()[0] is None)
    try:
        return fit_to_budget(cfg, profile, rehearsal=rehearsal, typed=typed, echo=_echo)
    except DoesNotFitError:
        raise
    except PlanningError as error:
        _echo(f"memory planner unavailable ({error}); the run is not checked against the budget")
        return None


def _typed_override(plus_hw: bool) -> Callable[[str], str]:
    """Overrides as the user appends them: `+hw.key=…` when no `+hw=` profile was given, and
    `++hw.key=…` when the command adds that key already (Hydra refuses to add a key twice)."""
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


def requested_profile(
    cfg: DictConfig, *, conf_dir: Path, device: DeviceInfo | None = None, echo: bool = True
) -> RequestedProfile:
    """The `+hw=<name>` profile of `cfg`, or the one detected for `device` (probed when None).

    A detected profile (with any `hw.*` keys given on top) is written into `cfg.hw`. Raises
    `ProfileError` naming each bad key, its file and the command-line override that set it.
    """
    conf_dir = Path(conf_dir)
    hw_dir = conf_dir / "hw"
    display_root = conf_dir.parent
    choice, overrides = _hydra_hw_context()
    given = cfg.get("hw")
    detected = _needs_detection(given, choice)
    if detected:
        detection = detect_profile(device or probe_device(), hw_dir, display_root=display_root)
        raw = detection.raw
        line = f"detected {detection.reason}"
        if given is not None:
            raw = OmegaConf.merge(raw, given)
            line += f"; hw keys given on top: {', '.join(str(key) for key in given)}"
        if echo:
            _echo(line)
        with open_dict(cfg):
            cfg.hw = raw
        source = ProfileSource(detection.source.file, overrides)
    else:
        source = ProfileSource(_profile_file(choice, given, hw_dir, display_root), overrides)
    return RequestedProfile(validate_profile(cfg.hw, source), source, detected)


def resolve_batch_sizes(
    profile: HardwareProfile, cfg: DictConfig, source: ProfileSource
) -> HardwareProfile:
    """Replace "auto" batch sizes by the task's stated defaults and derive accumulation.

    "auto" takes `batch_size_defaults.train` / `batch_size_defaults.val` (positive ints);
    a set `target_effective_batch` gives accumulate_grad_batches =
    ceil(target / (batch_size × devices × num_nodes)). Prints one line for each of the two
    decisions.
    """
    updates: dict[str, int] = {}
    for field, data_key in _DATA_DEFAULTS:
        if getattr(profile, field) == AUTO:
            updates[field] = _data_default(cfg, data_key, field, source)
    if updates:
        taken = ", ".join(
            f"{field} {updates[field]} ({DEFAULTS_KEY}.{data_key})"
            for field, data_key in _DATA_DEFAULTS
            if field in updates
        )
        _echo(f"batch sizes 'auto' take the task's stated defaults: {taken}")
    profile = profile.model_copy(update=updates)

    target = profile.target_effective_batch
    if target is None:
        return profile
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
    _echo(line)
    return profile.model_copy(update={"accumulate_grad_batches": accumulate})


def _planned_batch_sizes(
    cfg: DictConfig, profile: HardwareProfile, plan: MemoryPlan | None = None
) -> HardwareProfile:
    """A GPU profile with its "auto" batch sizes resolved by the memory planner (from `plan`
    when the requested run was planned already)."""
    wants_auto = AUTO in (profile.batch_size, profile.val_batch_size)
    if profile.accelerator != "gpu" or not wants_auto or not _plannable(cfg):
        return profile
    # Imported here: the planner pulls in Lightning and fake tensors, which CPU runs never need.
    from vramkit.core.planner import DoesNotFitError, PlanningError, resolve_auto_batch_sizes
    from vramkit.core.run.plan_request_from_config import plan_request

    predictions: dict = {}
    try:
        request = plan_request(cfg, profile, with_remedies=False)
        train, val, accumulate, lines = resolve_auto_batch_sizes(request, plan, predictions)
    except DoesNotFitError:
        raise
    except PlanningError as error:
        _echo(f"memory planner unavailable ({error}); 'auto' takes the task's stated defaults")
        return profile
    for line in lines:
        _echo(line)
    if predictions:
        _write_memory_plan(cfg, predictions)
    return profile.model_copy(
        update={"batch_size": train, "val_batch_size": val, "accumulate_grad_batches": accumulate}
    )


@rank_zero_only
def _write_memory_plan(cfg: DictConfig, predictions: dict) -> None:
    """The planner's predicted peaks beside the run's measured ones: report.html draws both."""
    # Imported here, as the planner is: only GPU runs that plan write the file.
    from vramkit.core.report.build import MEMORY_PLAN

    try:
        output_dir = OmegaConf.select(cfg, "paths.output_dir", default=None)
    except Exception:  # ${hydra:...} outside a Hydra run: no run folder to write into
        output_dir = None
    if output_dir is None:
        return
    folder = Path(output_dir)
    folder.mkdir(parents=True, exist_ok=True)
    # A resumed run's plan goes beside the first run's (memory_plan.resume_1.json), which the
    # report keeps reading: a resume refused after settling leaves that folder as it was.
    name = record_name(folder, MEMORY_PLAN) if (folder / RUN_CONFIG).is_file() else MEMORY_PLAN
    (folder / name).write_text(json.dumps(predictions, indent=2) + "\n")


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


@rank_zero_only
def _echo(line: str) -> None:
    # A log record, not a print: `--cfg job` output stays plain YAML, and DDP says it once.
    log.info("hw: %s", line)
