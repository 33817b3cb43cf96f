"""Does the chosen profile fit the device this process sees, and if not, what then.

A profile is a plan made for one card. On a smaller card, a card without bf16, or a machine
without CUDA, the plan is wrong: `check_profile` refuses with one message (what was expected,
what was found, the two ways out) unless `hw.strict=false`, in which case the profile's settings
are mapped to what the device supports so the run can be rehearsed. On a larger card the run
is capped to the profile's memory (`apply_memory_cap`), so it behaves as it will on the target.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vramkit.core.hardware.detect import DeviceInfo, memory_tolerance_gib
from vramkit.core.hardware.memory_stats import HostLimit, read_host_limit
from vramkit.core.hardware.profile import HardwareProfile, ProfileError, ProfileSource
from vramkit.core.units import GIB

_CPU_SAFE_PRECISIONS = ("32-true", "64-true")
_BF16_TO_FP16 = {"bf16-mixed": "16-mixed", "bf16-true": "16-true"}


class HardwareMismatchError(RuntimeError):
    """The device cannot run the profile as planned and the profile is strict."""


@dataclass(frozen=True)
class DeviceFit:
    """How a profile fits a device: the profile to run with and what had to change."""

    profile: HardwareProfile
    """The profile with every change below applied (the input when nothing changed)."""
    problems: tuple[str, ...]
    """Ways the device falls short of the profile; a strict profile refuses when any exist."""
    changes: tuple[str, ...]
    """Settings mapped to the device, e.g. "precision 16-mixed → 32-true (…)"."""
    kept: str
    """What the mapping deliberately leaves alone, e.g. "batch sizes kept"."""
    memory_cap: float | None
    """Fraction of the device's memory to cap this process at (a larger GPU), else None."""

    def mapping(self) -> str:
        """The changes as one line, e.g. "accelerator gpu → cpu, …; batch sizes kept"."""
        if not self.changes:
            return f"settings unchanged; {self.kept}"
        return f"{', '.join(self.changes)}; {self.kept}"


def fit_to_device(profile: HardwareProfile, device: DeviceInfo) -> DeviceFit:
    """Compare `profile` with `device` and map its settings to what the device supports.

    Never raises: `check_profile` decides whether the problems found here stop the run.
    """
    if profile.accelerator == "cpu":
        return DeviceFit(profile, (), (), "settings unchanged", None)
    if device.kind != "cuda":
        return _fit_gpu_profile_to_cpu(profile, device)
    return _fit_gpu_profile_to_gpu(profile, device)


def _fit_gpu_profile_to_cpu(profile: HardwareProfile, device: DeviceInfo) -> DeviceFit:
    updates: dict[str, object] = {"accelerator": "cpu"}
    changes = ["accelerator gpu → cpu"]
    if profile.precision not in _CPU_SAFE_PRECISIONS:
        why = (
            "bf16 runs on CPU but slowly"
            if profile.precision.startswith("bf16")
            else "fp16 does not run on CPU"
        )
        updates["precision"] = "32-true"
        changes.append(f"precision {profile.precision} → 32-true ({why})")
    if profile.devices != 1:
        updates["devices"] = 1
        changes.append(f"devices {profile.devices} → 1")
    if profile.pin_memory:
        updates["pin_memory"] = False
        changes.append("pin_memory true → false")
    if profile.compile:
        updates["compile"] = False
        changes.append("compile true → false")
    workers = min(profile.num_workers, device.cpu_count)
    if workers != profile.num_workers:
        updates["num_workers"] = workers
        changes.append(f"num_workers {profile.num_workers} → {workers} (CPU cores)")
    return DeviceFit(
        profile=profile.model_copy(update=updates),
        problems=("no CUDA device",),
        changes=tuple(changes),
        kept="batch sizes kept",
        memory_cap=None,
    )


def _fit_gpu_profile_to_gpu(profile: HardwareProfile, device: DeviceInfo) -> DeviceFit:
    updates: dict[str, object] = {}
    problems: list[str] = []
    changes: list[str] = []
    kept = "batch sizes kept"

    if profile.devices > device.count:
        problems.append(f"the profile uses {profile.devices} GPUs, this machine has {device.count}")
        updates["devices"] = device.count
        changes.append(f"devices {profile.devices} → {device.count}")

    if profile.precision in _BF16_TO_FP16 and not device.bf16:
        fp16 = _BF16_TO_FP16[profile.precision]
        problems.append(f"{profile.precision} needs native bf16 (sm_80+), which this GPU lacks")
        updates["precision"] = fp16
        changes.append(f"precision {profile.precision} → {fp16} (no native bf16)")

    planned = profile.memory_gib
    memory_cap = None
    if planned is not None:
        margin = memory_tolerance_gib(planned)
        if device.memory_gib < planned - margin:
            problems.append(
                f"{device.memory_gib:.1f} GiB is less than the {planned:.1f} GiB the profile plans "
                f"for: the run would run out of memory where the plan says it fits"
            )
            kept = f"batch sizes kept, which may not fit in {device.memory_gib:.1f} GiB"
        elif device.memory_gib > planned + margin:
            memory_cap = planned / device.memory_gib

    return DeviceFit(
        profile=profile.model_copy(update=updates),
        problems=tuple(problems),
        changes=tuple(changes),
        kept=kept,
        memory_cap=memory_cap,
    )


def check_profile(
    profile: HardwareProfile, device: DeviceInfo, *, source: ProfileSource, detected: bool = False
) -> DeviceFit:
    """`fit_to_device`, raising `HardwareMismatchError` when a strict profile does not fit.

    `detected` says the profile came from detection (no `+hw=` given), which changes the ways
    out the message offers.
    """
    fit = fit_to_device(profile, device)
    if fit.problems and profile.strict:
        raise HardwareMismatchError(mismatch_message(profile, device, fit, source, detected))
    return fit


def check_memory_budget(
    profile: HardwareProfile,
    device: DeviceInfo,
    *,
    source: ProfileSource,
    host: HostLimit | None = None,
) -> None:
    """Refuse, in one line, a `memory_gib` this machine cannot have: on the `cpu` profile more
    than the host's memory (`host`, read from /proc/meminfo and the cgroup when None), on a GPU
    profile more than the GPU's total memory where the command line set it (a profile file's
    own memory on a smaller card is `check_profile`'s mismatch, with its two ways out).

    Refusing, not capping: a budget above the machine is a typo or a copied command, and a cap
    would plan a run the user did not ask for; less memory than stated *now* (other processes)
    is capped by the host plan instead (`host_memory.host_budget`).
    """
    stated = profile.memory_gib
    if stated is None:
        return
    where = source.where("memory_gib")
    if profile.accelerator == "cpu":
        host = host if host is not None else read_host_limit()
        if host is None or stated * GIB <= host.limit:
            return
        have = host.limit / GIB
        raise ProfileError(
            f"hw.memory_gib={stated:g} ({where}) is more than this host's memory ({host.source}):"
            f" state at most {have:.1f}, or leave it null to plan within what the host has free",
            keys=("memory_gib",),
        )
    overridden = source.override_for("hw.memory_gib") is not None
    if device.kind != "cuda" or not overridden:
        return
    if stated > device.memory_gib + memory_tolerance_gib(device.memory_gib):
        raise ProfileError(
            f"hw.memory_gib={stated:g} ({where}) is more than this GPU's memory "
            f"({device.name}, {device.memory_gib:.1f} GiB): state at most "
            f"{device.memory_gib:.1f}, or drop the override to use profile {profile.name}'s",
            keys=("memory_gib",),
        )


def mismatch_message(
    profile: HardwareProfile,
    device: DeviceInfo,
    fit: DeviceFit,
    source: ProfileSource,
    detected: bool = False,
) -> str:
    """The refusal: what the profile expects, what was found, why that fails, the two ways out."""
    if detected:
        first_way = "drop the hw overrides that asked for this, or"
        strict_override = "+hw.strict=false"
    else:
        first_way = f"omit +hw={profile.name} to let vramkit detect this machine's profile, or"
        strict_override = "hw.strict=false"
    return "\n".join(
        [
            f"hardware profile '{profile.name}' ({source.file}) does not fit this machine:",
            f"  expected: {profile.expectation()}",
            f"  found:    {device.describe()}",
            f"  problem:  {'; '.join(fit.problems)}",
            "Two ways out:",
            f"  - {first_way}",
            f"  - add {strict_override} to rehearse {profile.name}'s settings on this device: "
            f"{fit.mapping()}",
        ]
    )


def apply_memory_cap(profile: HardwareProfile, device: DeviceInfo) -> float | None:
    """Cap this process's CUDA caching allocator at the profile's memory on a larger GPU.

    Sets `torch.cuda.set_per_process_memory_fraction(profile.memory_gib / device.memory_gib)`
    on each device the run uses and returns that fraction; returns None and does nothing for CPU
    profiles or devices, when the device is not larger, or when CUDA is not available.
    """
    if profile.accelerator != "gpu" or device.kind != "cuda" or profile.memory_gib is None:
        return None
    fraction = profile.memory_gib / device.memory_gib
    if fraction >= 1.0 or not torch.cuda.is_available():
        return None
    for index in range(min(profile.devices, device.count)):
        torch.cuda.set_per_process_memory_fraction(fraction, index)
    return fraction
