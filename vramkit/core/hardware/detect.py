"""What machine is this, and which `conf/hw` profile fits it.

`probe_device` asks torch what it sees; `detect_profile` picks the profile whose `device_pattern`
matches the GPU's name and whose `memory_gib` is nearest the GPU's, `cpu` without a GPU, and for
a GPU no profile describes, a generic profile derived from the GPU's own properties (a wrong named
profile would plan with another card's memory and kernels).
"""

from __future__ import annotations

import ctypes
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
import yaml
from omegaconf import DictConfig, OmegaConf

from vramkit.core.hardware.profile import (
    HardwareProfile,
    ProfileError,
    ProfileSource,
    validate_profile,
)
from vramkit.core.units import GIB

GENERIC_PROFILE_NAME = "generic"
CPU_PROFILE_NAME = "cpu"


@dataclass(frozen=True)
class DeviceInfo:
    """The device a run would use, as torch reports it."""

    kind: Literal["cuda", "cpu"]
    """"cuda" when torch sees a CUDA device, else "cpu"."""
    name: str
    """torch's device name, e.g. "Tesla T4"; "CPU" without CUDA."""
    memory_gib: float
    """CUDA: total_memory / 2**30 of device 0; CPU: host memory in GiB (0.0 when unknown)."""
    capability: tuple[int, int] | None
    """CUDA compute capability (major, minor); None for CPU."""
    count: int
    """Number of visible CUDA devices (0 for CPU)."""
    cpu_count: int
    """CPU cores this process may use."""
    software: str | None = None
    """CUDA only: "driver 550.54.15, CUDA runtime 13.0, cuDNN 9.24.0" (`cuda_software`)."""

    @property
    def bf16(self) -> bool:
        """Native bf16 tensor cores (sm_80+); torch's own check also admits slow emulation."""
        return self.capability is not None and self.capability >= (8, 0)

    def describe(self) -> str:
        """One phrase for messages, e.g. "Tesla T4, 14.6 GiB, compute capability 7.5"."""
        if self.kind != "cuda":
            return f"no CUDA device; CPU with {self.cpu_count} cores"
        text = f"{self.name}, {self.memory_gib:.1f} GiB"
        if self.capability is not None:
            text += f", compute capability {self.capability[0]}.{self.capability[1]}"
        if self.count > 1:
            text += f", {self.count} devices"
        if self.software is not None:
            text += f"; {self.software}"
        return text


def usable_cpu_count() -> int:
    """CPU cores this process may run on (respects affinity masks and container limits)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def host_memory_gib() -> float:
    """Physical host memory in GiB, 0.0 where the platform does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GIB
    except (AttributeError, ValueError, OSError):
        return 0.0


def nvidia_driver_version() -> str | None:
    """The NVIDIA driver's version ("550.54.15") from NVML, None where NVML does not answer.

    torch has no public call for it; NVML's library comes with every driver.
    """
    try:
        nvml = ctypes.CDLL("libnvidia-ml.so.1")
        if nvml.nvmlInit_v2() != 0:
            return None
        buffer = ctypes.create_string_buffer(96)
        found = nvml.nvmlSystemGetDriverVersion(buffer, len(buffer)) == 0
        nvml.nvmlShutdown()
    except (OSError, AttributeError):
        return None
    return buffer.value.decode() if found else None


def cudnn_version_text(version: int | None) -> str:
    """cuDNN's integer version as text: 92400 → "9.24.0" (cuDNN 9), 8907 → "8.9.7" (cuDNN 8)."""
    if not version:
        return "none"
    step = 10000 if version >= 90000 else 1000
    major, rest = divmod(version, step)
    return f"{major}.{rest // 100}.{rest % 100}"


def cuda_software() -> str:
    """Driver, CUDA runtime and cuDNN versions, e.g. "driver 550.54.15, CUDA runtime 13.0,
    cuDNN 9.24.0": a plan holds for a build; these tell which one a run used."""
    driver = nvidia_driver_version() or "unknown"
    cudnn = cudnn_version_text(torch.backends.cudnn.version())
    return f"driver {driver}, CUDA runtime {torch.version.cuda}, cuDNN {cudnn}"


def probe_device() -> DeviceInfo:
    """Describe CUDA device 0, or the CPU when torch sees no CUDA device.

    Without CUDA nothing beyond `torch.cuda.is_available()` is called, so a CPU-only machine
    never initialises CUDA here.
    """
    cpu_count = usable_cpu_count()
    if not torch.cuda.is_available():
        return DeviceInfo(
            kind="cpu",
            name="CPU",
            memory_gib=host_memory_gib(),
            capability=None,
            count=0,
            cpu_count=cpu_count,
        )
    properties = torch.cuda.get_device_properties(0)
    return DeviceInfo(
        kind="cuda",
        name=properties.name,
        memory_gib=properties.total_memory / GIB,
        capability=(properties.major, properties.minor),
        count=torch.cuda.device_count(),
        cpu_count=cpu_count,
        software=cuda_software(),
    )


def memory_tolerance_gib(planned_gib: float) -> float:
    """How far (GiB) a device's reported memory may sit from a profile's and still be that card.

    Drivers, ECC and displays move the reported total by a few hundred MiB (an RTX 4090 Laptop
    reports 15.6-16 GiB); 4 % with a 0.5 GiB floor absorbs that yet keeps 40 GB and 80 GB apart.
    """
    return max(0.5, 0.04 * planned_gib)


@dataclass(frozen=True)
class ProfileFile:
    """A profile YAML file: its raw values (for `cfg.hw`) and their validated form."""

    path: Path
    source: ProfileSource
    raw: DictConfig
    profile: HardwareProfile


def display_path(path: Path, root: Path) -> str:
    """`path` relative to `root` when inside it ("conf/hw/t4.yaml"), else as given."""
    try:
        return str(path.relative_to(root))
    except ValueError:
        return str(path)


def load_profile_file(path: Path, *, display_root: Path) -> ProfileFile:
    """Read and validate one profile YAML; errors name the file (and line for YAML syntax)."""
    source = ProfileSource(display_path(path, display_root))
    try:
        raw = OmegaConf.load(path)
    except FileNotFoundError as error:
        raise ProfileError(f"{source.file}: no such hardware profile file") from error
    except yaml.YAMLError as error:
        raise ProfileError(f"{source.file}: not valid YAML: {error}") from error
    if not isinstance(raw, DictConfig):
        raise ProfileError(f"{source.file}: a hardware profile must be a mapping of fields")
    return ProfileFile(path, source, raw, validate_profile(raw, source))


@dataclass(frozen=True)
class Detection:
    """The profile detection chose, the values to place under `cfg.hw`, and why (one line)."""

    profile: HardwareProfile
    raw: DictConfig
    source: ProfileSource
    reason: str


def detect_profile(device: DeviceInfo, hw_dir: Path, *, display_root: Path) -> Detection:
    """Pick the profile for `device` from the YAML files in `hw_dir`.

    A CUDA device takes the profile whose `device_pattern` matches its name and whose
    `memory_gib` is nearest its memory, provided that memory is within `memory_tolerance_gib`;
    otherwise it gets a generic profile built by `generic_profile`. No CUDA device: `cpu`.
    """
    if device.kind != "cuda":
        found = load_profile_file(hw_dir / f"{CPU_PROFILE_NAME}.yaml", display_root=display_root)
        reason = f"{device.describe()} → profile cpu ({found.source.file})"
        return Detection(found.profile, found.raw, found.source, reason)

    files = [load_profile_file(p, display_root=display_root) for p in sorted(hw_dir.glob("*.yaml"))]
    named = [f for f in files if _name_matches(f.profile, device)]
    if named:
        best = min(named, key=lambda f: abs(f.profile.memory_gib - device.memory_gib))
        planned = best.profile.memory_gib
        if abs(planned - device.memory_gib) <= memory_tolerance_gib(planned):
            reason = (
                f"{device.name!r} matches {best.profile.device_pattern!r} and its "
                f"{device.memory_gib:.2f} GiB is nearest the profile's {planned:.1f} GiB "
                f"→ profile {best.profile.name} ({best.source.file})"
            )
            if device.software is not None:
                reason += f"; {device.software}"
            return Detection(best.profile, best.raw, best.source, reason)
        why = (
            f"{device.name!r} has the name of profile {best.profile.name} but "
            f"{device.memory_gib:.1f} GiB, not its {planned:.1f} GiB"
        )
    else:
        why = f"{device.name!r} matches no profile in {display_path(hw_dir, display_root)}"

    profile = generic_profile(device)
    source = ProfileSource(f"generic profile for {device.name!r}")
    reason = (
        f"{why} → generic profile derived from its properties ({device.describe()}): "
        f"{profile.precision}, compile {'on' if profile.compile else 'off'}; "
        f"add a conf/hw/ profile to tune it"
    )
    return Detection(profile, OmegaConf.create(profile.model_dump()), source, reason)


def _name_matches(profile: HardwareProfile, device: DeviceInfo) -> bool:
    if profile.accelerator != "gpu" or profile.device_pattern is None:
        return False
    return re.search(profile.device_pattern, device.name, flags=re.IGNORECASE) is not None


def generic_profile(device: DeviceInfo) -> HardwareProfile:
    """A profile for a CUDA device no named profile describes, derived from its properties.

    Precision follows the capability: bf16-mixed on sm_80+ (native bf16), 16-mixed on sm_70+
    (fp16 tensor cores), 32-true below (no tensor cores to gain from). torch.compile only on
    sm_80+, where Triton is fast to compile and well supported. Channels last on sm_70+: its gains
    are those of the tensor cores under AMP (PyTorch's channels-last tutorial measured 22% on
    ResNet-50 training on a V100, docs.pytorch.org/tutorials/intermediate/memory_format_tutorial).
    Throughput facts stay unknown.
    """
    capability = device.capability or (0, 0)
    if capability >= (8, 0):
        precision = "bf16-mixed"
    elif capability >= (7, 0):
        precision = "16-mixed"
    else:
        precision = "32-true"
    return HardwareProfile(
        name=GENERIC_PROFILE_NAME,
        display_name=device.name,
        device_pattern=f"^{re.escape(device.name)}$",
        memory_gib=round(device.memory_gib, 2),
        compute_capability=f"{capability[0]}.{capability[1]}",
        bf16=device.bf16,
        flash_attention=capability >= (8, 0),
        mem_efficient_attention=capability >= (5, 0),
        accelerator="gpu",
        precision=precision,
        num_workers=min(4, device.cpu_count),
        pin_memory=True,
        compile=capability >= (8, 0),
        channels_last=capability >= (7, 0),
    )
