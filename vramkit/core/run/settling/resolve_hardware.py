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
    ProfileSource,
    override_key,
    validate_profile,
)
from vramkit.core.planner.request import (
    BATCH_SIZE_KEYS,
    DEFAULTS_KEY,
    batch_size_request,
    task_batch_defaults,
)

if TYPE_CHECKING:
    from vramkit.core.planner.decisions.run_memory import Mode, RunMemory

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
    top. With a model and data to plan (and `plan_batches` true) the planner decides the run's
    memory in one call (`fit_to_budget.plan_memory`): on a GPU the requested run is planned and,
    when it does not fit, `hw.fit: auto` takes the cheapest remedy that fits and settles the
    config `compose_with(remedy)` gives instead (raises `RemedyNeedsComposition` without
    `compose_with`), `hw.fit: off` refuses with the remedies listed; a GPU profile rehearsed on a
    CPU (`hw.strict=false`) only says what it would do; a `cpu` run's sizes are fitted into the
    host's memory. "auto" batch sizes come from the planner (else from the task's stated
    defaults). Raises `ProfileError` for an invalid profile or missing data defaults,
    `HardwareMismatchError` when a strict profile does not fit the device, and the planner's
    `DoesNotFitError` when the run does not fit and is not fitted. With `check_device=False` the
    profile is settled for its own hardware (a preview, as `scripts/plan_memory.py
    --print-config` shows it): no device check and no memory cap. With `plan_inference`
    (eval.py) a GPU profile's `val_batch_size` is the inference plan's.
    """
    cfg = copy.deepcopy(cfg)  # a detected profile is written into its hw node for the planner
    if check_device and device is None:
        device = probe_device()
    requested, profile, lines = _checked_profile(cfg, conf_dir, device, check_device)
    remedy: tuple[str, ...] = ()
    memory = None
    mode = _memory_mode(requested.profile, profile, check_device=check_device)
    wanted = plan_batches or (plan_inference and mode == "device")
    if mode is not None and wanted and _plannable(cfg):
        # Imported here: the planner pulls in Lightning and fake tensors.
        from vramkit.core.run.settling.fit_to_budget import plan_memory

        target = requested.profile if mode == "rehearsal" else profile
        typed = _typed_override()
        memory = plan_memory(
            cfg,
            target,
            mode=mode,
            source=requested.source,
            training=plan_batches,
            inference=plan_inference,
            typed=typed,
        )
        lines += memory.lines
        if memory.remedy:
            if compose_with is None:
                raise RemedyNeedsComposition(
                    f"the automatic fit chose {' '.join(memory.remedy)}, and this caller "
                    "gave no way to compose it: settle the config with "
                    "vramkit.core.run.settling.settle.settle"
                )
            remedy, record = memory.remedy, memory.fit_record
            cfg = compose_with(remedy)
            # The remedy's config: its profile settled again, its lines said already.
            requested, profile, _ = _checked_profile(cfg, conf_dir, device, check_device)
            memory = plan_memory(
                cfg,
                profile,
                mode="device",
                source=requested.source,
                check_fit=False,
                inference=plan_inference,
                typed=typed,
            )
            memory = dataclasses.replace(memory, fit_record=record)
            lines += memory.lines
        profile = profile.model_copy(update=_decided_sizes(memory))
    profile, said = resolve_batch_sizes(profile, cfg, source=requested.source)
    lines += said
    if memory is None:
        return SettledProfile(profile, requested, remedy, lines, None, None)
    lines += memory.host_lines
    return SettledProfile(profile, requested, remedy, lines, memory.fit_record, memory.memory_plan)


def _memory_mode(
    requested: HardwareProfile, running: HardwareProfile, *, check_device: bool
) -> Mode | None:
    """How the planner decides the run's memory: a GPU run on its GPU ("device"), a GPU profile
    rehearsed on a CPU ("rehearsal"), a `cpu` run within the host's memory ("host", not in a
    preview); None when there is nothing to plan."""
    if running.accelerator == "gpu":
        return "device"
    if requested.accelerator == "gpu":
        return "rehearsal" if requested.budget_gib is not None else None
    return "host" if check_device else None


def _decided_sizes(memory: RunMemory) -> dict[str, int]:
    decided = {
        "batch_size": memory.train_batch_size,
        "val_batch_size": memory.val_batch_size,
        "accumulate_grad_batches": memory.accumulate_grad_batches,
    }
    return {key: value for key, value in decided.items() if value is not None}


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


def _plannable(cfg: DictConfig) -> bool:
    """The config has a model and a datamodule to build (each with a `_target_`)."""
    return all(
        isinstance(cfg.get(key), DictConfig) and "_target_" in cfg[key] for key in ("model", "data")
    )


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
    for (field, _), auto in zip(BATCH_SIZE_KEYS, asked.searched, strict=True):
        if auto:  # the task's defaults are read only when asked for (a bad one is refused)
            updates[field] = task_batch_defaults(cfg).for_auto(field, source)
    if updates:
        taken = ", ".join(
            f"{field} {updates[field]} ({DEFAULTS_KEY}.{data_key})"
            for field, data_key in BATCH_SIZE_KEYS
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
