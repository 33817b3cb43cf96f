"""The hardware profile schema: what a machine is (facts) and how vramkit runs on it (decisions).

A profile is one YAML file under `conf/hw/` (`python train.py +hw=t4`) whose top level holds the
fields of `HardwareProfile`, a pydantic `Settings` class (each field's type, default, limits and
one-line doc, once). `validate_profile` turns such a mapping into a `HardwareProfile` and refuses
unknown keys, wrong types and impossible values with an error that names the key and the file (or
command-line override) it came from. Code changes a profile with ``model_copy(update=…)`` and
writes it into a config with ``model_dump()``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal, get_args

from omegaconf import DictConfig
from omegaconf.errors import OmegaConfBaseException
from pydantic import Field

from vramkit.core.config.schema import ConfigError
from vramkit.core.config.settings import Settings
from vramkit.core.config.source import ConfigSource
from vramkit.core.config.source import override_key as override_key
from vramkit.core.data.loaders import DEFAULT_NUM_WORKERS

AUTO = "auto"
"""Batch-size value meaning: let vramkit choose (today: the data config's stated default)."""

Precision = Literal["32-true", "16-mixed", "bf16-mixed", "bf16-true", "16-true", "64-true"]
PRECISIONS: tuple[str, ...] = get_args(Precision)
"""Lightning precision strings a profile may ask for."""

Accelerator = Literal["gpu", "cpu"]
ACCELERATORS: tuple[str, ...] = get_args(Accelerator)

Fit = Literal["auto", "off"]
FIT_MODES: tuple[str, ...] = get_args(Fit)
"""What a run does when its plan does not fit: apply the cheapest remedy that fits, or refuse."""

FitConsent = Literal["lora"]
FIT_CONSENTS: tuple[str, ...] = get_args(FitConsent)
"""What `hw.fit_allow` may grant: remedies that change what is trained ("lora")."""

# Lightning turns fp16 AMP on CPU silently into bf16; a CPU profile must say what it means.
_CPU_PRECISIONS = ("32-true", "64-true", "bf16-mixed", "bf16-true")


class ProfileError(ConfigError):
    """A hardware profile that cannot be used; the message names each bad key and its source.

    `keys` lists the offending keys (without the `hw.` prefix) in the order they were found.
    """


class HardwareProfile(Settings):
    """One machine's facts and the run settings vramkit derives from them (conf/hw/*.yaml)."""

    # Facts: what the hardware is. They feed messages, detection and memory planning.
    name: str
    """Profile id; equals the YAML file's stem (`t4` for conf/hw/t4.yaml)."""
    display_name: str | None = None
    """How messages name the hardware, e.g. "NVIDIA T4"; the profile id when null."""
    device_pattern: str | None = None
    """Regex (case-insensitive, `re.search`) matched against the CUDA device name for detection."""
    memory_gib: float | None = Field(None, gt=0)
    """Device memory in GiB as PyTorch reports it (total_memory / 2**30); null for CPU."""
    compute_capability: str | None = None
    """CUDA compute capability "major.minor", e.g. "7.5"; null for CPU."""
    bf16: bool = False
    """Native bf16 tensor-core support (sm_80 and newer)."""
    flash_attention: bool = False
    """PyTorch's flash SDPA kernel is available (sm_80 and newer)."""
    mem_efficient_attention: bool = False
    """PyTorch's memory-efficient SDPA kernel is available."""
    peak_tflops_fp16: float | None = Field(None, gt=0)
    """Dense fp16 tensor throughput with fp32 accumulate (TFLOPS, datasheet, no sparsity)."""
    peak_tflops_bf16: float | None = Field(None, gt=0)
    """Dense bf16 tensor throughput (TFLOPS, datasheet, no sparsity); null without bf16."""
    peak_tflops_fp32: float | None = Field(None, gt=0)
    """Dense fp32 throughput without tensor cores (TFLOPS, datasheet)."""
    bandwidth_gbs: float | None = Field(None, gt=0)
    """Peak device-memory bandwidth (GB/s, datasheet)."""

    # Decisions: how a run uses the hardware. The trainer and data configs interpolate these.
    accelerator: Accelerator
    """Lightning accelerator: "gpu" or "cpu"."""
    devices: int = Field(1, ge=1)
    """Number of devices Lightning uses on each machine (GPUs per node)."""
    num_nodes: int = Field(1, ge=1)
    """Machines the run spans (Lightning's `Trainer(num_nodes=…)`); the world size is
    `devices × num_nodes` and the global batch `batch_size × devices × num_nodes ×
    accumulate_grad_batches`."""
    precision: Precision
    """Lightning precision: 16-mixed on sm_75, bf16-mixed where bf16 is native, 32-true on CPU."""
    memory_budget_fraction: float = Field(0.85, gt=0, le=1)
    """Share of `memory_gib` a run may plan to use, in (0, 1]; the rest is headroom."""
    num_workers: int = Field(DEFAULT_NUM_WORKERS, ge=0)
    """DataLoader worker processes (≥ 0); each profile file states its own count."""
    pin_memory: bool = False
    """Page-locked host memory for faster host-to-GPU copies."""
    compile: bool = False
    """Wrap the model in torch.compile (Triton needs sm_70+; slow to compile on sm_75)."""
    channels_last: bool = False
    """Convolution weights and image batches in NHWC (channels last), same bytes: cuDNN's
    tensor-core kernels under AMP (sm_70+) and oneDNN on CPU run convolutions faster in it
    (PyTorch's channels-last tutorial: 22% on ResNet-50 training, V100, AMP)."""
    batch_size: Annotated[int, Field(gt=0)] | Literal["auto"] = AUTO
    """Training samples per step and device: a positive int or "auto"."""
    val_batch_size: Annotated[int, Field(gt=0)] | Literal["auto"] = AUTO
    """Validation samples per step and device: a positive int or "auto"."""
    accumulate_grad_batches: int = Field(1, ge=1)
    """Optimizer steps happen every this many batches."""
    target_effective_batch: int | None = Field(None, ge=1)
    """When set, accumulate_grad_batches = ceil(target / (batch_size * devices * num_nodes))."""
    strict: bool = True
    """Refuse to run when the device does not match the profile (false: map and rehearse)."""
    fit: Fit = AUTO
    """When the plan does not fit the budget: "auto" applies the cheapest remedy that fits
    (vramkit.core.planner.decisions.auto_fit), "off" refuses and lists the remedies."""
    fit_allow: tuple[FitConsent, ...] = ()
    """Remedies `fit: auto` may apply although they change what is trained, e.g. ["lora"]."""

    @property
    def label(self) -> str:
        """The hardware's name for messages: `display_name`, else the profile id."""
        return self.display_name or self.name

    @property
    def capability(self) -> tuple[int, int] | None:
        """`compute_capability` as a (major, minor) tuple; None for CPU profiles."""
        if self.compute_capability is None:
            return None
        major, minor = self.compute_capability.split(".")
        return int(major), int(minor)

    @property
    def world_size(self) -> int:
        """Processes of a run: `devices` on each of `num_nodes` machines."""
        return self.devices * self.num_nodes

    @property
    def budget_gib(self) -> float | None:
        """Device memory a run may plan to use (GiB); None when the memory is unknown."""
        if self.memory_gib is None:
            return None
        return self.memory_gib * self.memory_budget_fraction

    def expectation(self) -> str:
        """What the profile expects, e.g. "NVIDIA T4, 14.6 GiB, compute capability 7.5"."""
        if self.accelerator == "cpu":
            return "a CPU"
        parts = [self.label]
        if self.memory_gib is not None:
            parts.append(f"{self.memory_gib:.1f} GiB")
        if self.compute_capability is not None:
            parts.append(f"compute capability {self.compute_capability}")
        if self.devices > 1:
            parts.append(f"{self.devices} devices")
        if self.num_nodes > 1:
            parts.append(f"{self.num_nodes} nodes")
        return ", ".join(parts)

    def cross_field_problems(self) -> list[tuple[str, str]]:
        """Problems the field types and limits cannot state (run once every field is valid)."""
        return _value_problems(self)


@dataclass(frozen=True)
class ProfileSource(ConfigSource):
    """Where a profile's values came from, so that an error can point there.

    `file` is the profile file as the user knows it ("conf/hw/t4.yaml") or a description of a
    generated profile; `overrides` are the command-line overrides that touched `hw`.
    """

    def where(self, key: str) -> str:
        """The file, plus the command-line override that set `hw.<key>` when there is one."""
        setter = self.override_for(f"hw.{key}")
        if setter is None:
            return self.file
        return f"{self.file}; command-line override '{setter}'"


def validate_profile(raw: Mapping[str, Any] | DictConfig, source: ProfileSource) -> HardwareProfile:
    """Check a profile mapping against `HardwareProfile` and return it as that class.

    Unknown keys (with the closest valid key), values of the wrong type (with the expected type)
    and impossible values are all reported at once in one `ProfileError` that names each key and
    `source`. Interpolations in a DictConfig are resolved first.
    """
    title = f"hardware profile '{name}'" if (name := _stated_name(raw)) else "hardware profile"
    try:
        return HardwareProfile.from_config(
            raw, key_prefix="hw.", source=source, title=f"{title} is invalid"
        )
    except ConfigError as error:
        raise ProfileError(str(error), problems=error.problems) from None


def _stated_name(raw: object) -> str | None:
    """The profile's `name` for the error's title, when it states a usable one."""
    try:
        name = raw.get("name") if isinstance(raw, Mapping | DictConfig) else None
    except OmegaConfBaseException:
        return None  # an unresolvable name; from_config reports it
    return name if isinstance(name, str) else None


def _value_problems(profile: HardwareProfile) -> list[tuple[str, str]]:
    """What the field types and limits cannot say: rules between fields, formats, regexes."""
    problems: list[tuple[str, str]] = []

    def need(condition: bool, key: str, problem: str) -> None:
        if not condition:
            problems.append((key, problem))

    need(bool(profile.name.strip()), "name", "must not be empty")
    if profile.accelerator == "cpu":
        need(
            profile.precision in _CPU_PRECISIONS,
            "precision",
            f"'{profile.precision}' does not run on a CPU (fp16 needs CUDA); use 32-true",
        )
        # Lightning launches one process per device on each node and several nodes talk over
        # NCCL; the project's CPU multi-process runs (trainer=ddp_sim) are one machine's gloo.
        need(
            profile.num_nodes == 1,
            "num_nodes",
            f"a CPU profile runs on one machine, got {profile.num_nodes}; several nodes need a "
            "GPU profile (e.g. +hw=a100_40gb hw.num_nodes=2)",
        )
    if profile.device_pattern is not None:
        try:
            re.compile(profile.device_pattern)
        except re.error as error:
            problems.append(("device_pattern", f"not a valid regex: {error}"))
    if profile.compute_capability is not None:
        need(
            re.fullmatch(r"\d+\.\d+", profile.compute_capability) is not None,
            "compute_capability",
            f'expected "major.minor" like "7.5", got {profile.compute_capability!r}',
        )
    if profile.accelerator == "gpu":
        need(profile.memory_gib is not None, "memory_gib", "a gpu profile must state its memory")
        need(
            profile.compute_capability is not None,
            "compute_capability",
            "a gpu profile must state its compute capability",
        )
    return problems


def describe_profile(profile: HardwareProfile, *, loader_workers: int | None = None) -> str:
    """A few lines for the console: profile, precision, memory budget (GiB), batches, loader.

    ``loader_workers``: the worker processes the loaders actually get, when the run's data
    config sets a count other than the profile's (``data.num_workers``); None: the profile's.
    """
    target = "CPU" if profile.accelerator == "cpu" else f"{profile.devices}× GPU"
    if profile.num_nodes > 1:
        target += f" × {profile.num_nodes} nodes"
    shown = profile.label.lower() not in (profile.name.lower(), target.lower())
    head = f"hardware profile {profile.name}" + (f" ({profile.label})" if shown else "")
    head += f" on {target}"
    if profile.budget_gib is None:
        budget = "memory budget: host memory"
    else:
        budget = (
            f"memory budget {profile.budget_gib:.1f} GiB "
            f"({profile.memory_budget_fraction:.0%} of {profile.memory_gib:.1f} GiB)"
        )
        if profile.accelerator == "cpu":
            budget += ", planned for the GPU, not enforced on CPU"
    effective = _effective_batch(profile)
    batches = (
        f"batch size {profile.batch_size} train / {profile.val_batch_size} val, "
        f"accumulate {profile.accumulate_grad_batches}"
        + (f" (effective batch {effective})" if effective is not None else "")
    )
    used = profile.num_workers if loader_workers is None else loader_workers
    workers = f"{used} worker" + ("" if used == 1 else "s")
    if used != profile.num_workers:
        workers += f" (data.num_workers; the profile's {profile.num_workers} unused)"
    check = "strict" if profile.strict else "relaxed (hw.strict=false)"
    loader = (
        f"loader {workers}, pin_memory {_on_off(profile.pin_memory)}; "
        f"compile {_on_off(profile.compile)}; device check {check}"
    )
    return "\n".join(
        [head, f"  precision {profile.precision}, {budget}", f"  {batches}", f"  {loader}"]
    )


def _effective_batch(profile: HardwareProfile) -> int | None:
    if not isinstance(profile.batch_size, int):
        return None
    return profile.batch_size * profile.world_size * profile.accumulate_grad_batches


def _on_off(flag: bool) -> str:
    return "on" if flag else "off"
