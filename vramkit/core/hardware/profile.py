"""The hardware profile schema: what a machine is (facts) and how vramkit runs on it (decisions).

A profile is one YAML file under `conf/hw/` (`python train.py +hw=t4`) whose top level holds the
fields of `HardwareProfile`. `validate_profile` turns such a mapping into a `HardwareProfile` and
refuses unknown keys, wrong types and impossible values with an error that names the key and the
file (or command-line override) it came from.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException, ValidationError

AUTO = "auto"
"""Batch-size value meaning: let vramkit choose (today: the data config's stated default)."""

PRECISIONS = ("32-true", "16-mixed", "bf16-mixed", "bf16-true", "16-true", "64-true")
"""Lightning precision strings a profile may ask for."""

ACCELERATORS = ("gpu", "cpu")

# Lightning turns fp16 AMP on CPU silently into bf16; a CPU profile must say what it means.
_CPU_PRECISIONS = ("32-true", "64-true", "bf16-mixed", "bf16-true")

_BATCH_FIELDS = ("batch_size", "val_batch_size")


class ProfileError(ValueError):
    """A hardware profile that cannot be used; the message names each bad key and its source.

    `keys` lists the offending keys (without the `hw.` prefix) in the order they were found.
    """

    def __init__(self, message: str, keys: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.keys = keys


@dataclass(frozen=True, kw_only=True)
class HardwareProfile:
    """One machine's facts and the run settings vramkit derives from them (conf/hw/*.yaml)."""

    # Facts: what the hardware is. They feed messages, detection and memory planning.
    name: str
    """Profile id; equals the YAML file's stem (`t4` for conf/hw/t4.yaml)."""
    display_name: str | None = None
    """How messages name the hardware, e.g. "NVIDIA T4"; the profile id when null."""
    device_pattern: str | None = None
    """Regex (case-insensitive, `re.search`) matched against the CUDA device name for detection."""
    memory_gib: float | None = None
    """Device memory in GiB as PyTorch reports it (total_memory / 2**30); null for CPU."""
    compute_capability: str | None = None
    """CUDA compute capability "major.minor", e.g. "7.5"; null for CPU."""
    bf16: bool = False
    """Native bf16 tensor-core support (sm_80 and newer)."""
    flash_attention: bool = False
    """PyTorch's flash SDPA kernel is available (sm_80 and newer)."""
    mem_efficient_attention: bool = False
    """PyTorch's memory-efficient SDPA kernel is available."""
    peak_tflops_fp16: float | None = None
    """Dense fp16 tensor throughput with fp32 accumulate (TFLOPS, datasheet, no sparsity)."""
    peak_tflops_bf16: float | None = None
    """Dense bf16 tensor throughput (TFLOPS, datasheet, no sparsity); null without bf16."""
    peak_tflops_fp32: float | None = None
    """Dense fp32 throughput without tensor cores (TFLOPS, datasheet)."""
    bandwidth_gbs: float | None = None
    """Peak device-memory bandwidth (GB/s, datasheet)."""

    # Decisions: how a run uses the hardware. The trainer and data configs interpolate these.
    accelerator: str
    """Lightning accelerator: "gpu" or "cpu"."""
    devices: int = 1
    """Number of devices Lightning uses."""
    precision: str
    """Lightning precision: 16-mixed on sm_75, bf16-mixed where bf16 is native, 32-true on CPU."""
    memory_budget_fraction: float = 0.85
    """Share of `memory_gib` a run may plan to use, in (0, 1]; the rest is headroom."""
    num_workers: int = 2
    """DataLoader worker processes (≥ 0)."""
    pin_memory: bool = False
    """Page-locked host memory for faster host-to-GPU copies."""
    compile: bool = False
    """Wrap the model in torch.compile (Triton needs sm_70+; slow to compile on sm_75)."""
    batch_size: int | str = AUTO
    """Training samples per step and device: a positive int or "auto"."""
    val_batch_size: int | str = AUTO
    """Validation samples per step and device: a positive int or "auto"."""
    accumulate_grad_batches: int = 1
    """Optimizer steps happen every this many batches."""
    target_effective_batch: int | None = None
    """When set, accumulate_grad_batches = ceil(target / (batch_size * devices))."""
    strict: bool = True
    """Refuse to run when the device does not match the profile (false: map and rehearse)."""

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
        return ", ".join(parts)


FIELD_NAMES = tuple(f.name for f in dataclasses.fields(HardwareProfile))

_EXPECTED_TYPES = {
    "name": "str",
    "display_name": "str or null",
    "device_pattern": "str (a regex) or null",
    "memory_gib": "float or null",
    "compute_capability": 'str like "7.5", or null',
    "bf16": "bool",
    "flash_attention": "bool",
    "mem_efficient_attention": "bool",
    "peak_tflops_fp16": "float or null",
    "peak_tflops_bf16": "float or null",
    "peak_tflops_fp32": "float or null",
    "bandwidth_gbs": "float or null",
    "accelerator": "str",
    "devices": "int",
    "precision": "str",
    "memory_budget_fraction": "float",
    "num_workers": "int",
    "pin_memory": "bool",
    "compile": "bool",
    "batch_size": 'int or "auto"',
    "val_batch_size": 'int or "auto"',
    "accumulate_grad_batches": "int",
    "target_effective_batch": "int or null",
    "strict": "bool",
}


@dataclass(frozen=True)
class ProfileSource:
    """Where a profile's values came from, so that an error can point there.

    `file` is the profile file as the user knows it ("conf/hw/t4.yaml") or a description of a
    generated profile; `overrides` are the command-line overrides that touched `hw`.
    """

    file: str
    overrides: tuple[str, ...] = ()

    def override_for(self, key: str) -> str | None:
        """The last command-line override that set `hw.<key>`, or None."""
        setters = [o for o in self.overrides if override_key(o) == f"hw.{key}"]
        return setters[-1] if setters else None

    def where(self, key: str) -> str:
        """The file, plus the command-line override that set `key` when there is one."""
        setter = self.override_for(key)
        if setter is None:
            return self.file
        return f"{self.file}; command-line override '{setter}'"


def override_key(override: str) -> str:
    """The dotted key of a Hydra override: '+hw.precison=16-mixed' -> 'hw.precison'."""
    return override.lstrip("+~").split("=", 1)[0].strip()


def closest(word: str, choices: tuple[str, ...] | list[str]) -> str | None:
    """The valid choice nearest to a misspelt `word` (difflib), or None when nothing is close."""
    matches = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return matches[0] if matches else None


def validate_profile(raw: Mapping[str, Any] | DictConfig, source: ProfileSource) -> HardwareProfile:
    """Check a profile mapping against `HardwareProfile` and return it as that dataclass.

    Unknown keys (with the closest valid key), values of the wrong type (with the expected type)
    and impossible values are all reported at once in one `ProfileError` that names each key and
    `source`. Interpolations in a DictConfig are resolved first.
    """
    values = _to_plain_dict(raw, source)
    problems: list[tuple[str, str]] = []

    for key in values:
        if key not in FIELD_NAMES:
            hint = closest(str(key), FIELD_NAMES)
            suggestion = f"; did you mean hw.{hint}?" if hint else ""
            problems.append((str(key), f"unknown key{suggestion}"))

    schema = OmegaConf.structured(HardwareProfile)
    OmegaConf.set_readonly(schema, False)
    for key, value in values.items():
        if key not in FIELD_NAMES:
            continue
        try:
            schema[key] = value
        except ValidationError:
            problems.append(
                (key, f"expected {_EXPECTED_TYPES[key]}, got {value!r} ({type(value).__name__})")
            )
    reported = {key for key, _ in problems}
    for key in sorted(OmegaConf.missing_keys(schema) - reported):
        problems.append((key, f"missing (a required {_EXPECTED_TYPES[key]})"))
    _raise_if_any(problems, values, source)

    profile = HardwareProfile(**OmegaConf.to_container(schema))
    _raise_if_any(_value_problems(profile), values, source)
    return profile


def _to_plain_dict(raw: Mapping[str, Any] | DictConfig, source: ProfileSource) -> dict[str, Any]:
    if isinstance(raw, DictConfig):
        try:
            plain = OmegaConf.to_container(raw, resolve=True)
        except OmegaConfBaseException as error:
            raise ProfileError(f"{source.file}: cannot resolve the hw config: {error}") from error
    else:
        plain = raw
    if not isinstance(plain, Mapping):
        raise ProfileError(
            f"{source.file}: a hardware profile must be a mapping of profile fields, "
            f"got {type(plain).__name__}"
        )
    return dict(plain)


def _raise_if_any(
    problems: list[tuple[str, str]], values: Mapping[str, Any], source: ProfileSource
) -> None:
    if not problems:
        return
    name = values.get("name")
    title = f"hardware profile '{name}'" if isinstance(name, str) else "hardware profile"
    lines = [f"{title} is invalid ({source.file}):"]
    for key, problem in problems:
        setter = source.override_for(key)
        origin = f" (set by command-line override '{setter}')" if setter else ""
        lines.append(f"  hw.{key}: {problem}{origin}")
    raise ProfileError("\n".join(lines), keys=tuple(key for key, _ in problems))


def _value_problems(profile: HardwareProfile) -> list[tuple[str, str]]:
    problems: list[tuple[str, str]] = []

    def need(condition: bool, key: str, problem: str) -> None:
        if not condition:
            problems.append((key, problem))

    need(bool(profile.name.strip()), "name", "must not be empty")
    need(
        profile.accelerator in ACCELERATORS,
        "accelerator",
        _choice_problem(profile.accelerator, ACCELERATORS),
    )
    need(
        profile.precision in PRECISIONS, "precision", _choice_problem(profile.precision, PRECISIONS)
    )
    if profile.accelerator == "cpu" and profile.precision in PRECISIONS:
        need(
            profile.precision in _CPU_PRECISIONS,
            "precision",
            f"'{profile.precision}' does not run on a CPU (fp16 needs CUDA); use 32-true",
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
    for key in ("memory_gib", "peak_tflops_fp16", "peak_tflops_bf16", "peak_tflops_fp32"):
        value = getattr(profile, key)
        need(value is None or value > 0, key, f"must be positive, got {value}")
    need(
        profile.bandwidth_gbs is None or profile.bandwidth_gbs > 0,
        "bandwidth_gbs",
        f"must be positive, got {profile.bandwidth_gbs}",
    )
    need(profile.devices >= 1, "devices", f"must be ≥ 1, got {profile.devices}")
    need(
        0 < profile.memory_budget_fraction <= 1,
        "memory_budget_fraction",
        f"must be in (0, 1], got {profile.memory_budget_fraction}",
    )
    need(profile.num_workers >= 0, "num_workers", f"must be ≥ 0, got {profile.num_workers}")
    for key in _BATCH_FIELDS:
        value = getattr(profile, key)
        valid = value == AUTO or (isinstance(value, int) and value > 0)
        need(valid, key, f'expected a positive int or "auto", got {value!r}')
    need(
        profile.accumulate_grad_batches >= 1,
        "accumulate_grad_batches",
        f"must be ≥ 1, got {profile.accumulate_grad_batches}",
    )
    target = profile.target_effective_batch
    need(target is None or target >= 1, "target_effective_batch", f"must be ≥ 1, got {target}")
    return problems


def _choice_problem(value: str, choices: tuple[str, ...]) -> str:
    hint = closest(value, choices)
    suggestion = f"; did you mean '{hint}'?" if hint else ""
    return f"{value!r} is not one of {', '.join(choices)}{suggestion}"


def describe_profile(profile: HardwareProfile) -> str:
    """A few lines for the console: profile, precision, memory budget (GiB), batches, loader."""
    target = "CPU" if profile.accelerator == "cpu" else f"{profile.devices}× GPU"
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
    workers = f"{profile.num_workers} worker" + ("" if profile.num_workers == 1 else "s")
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
    return profile.batch_size * profile.devices * profile.accumulate_grad_batches


def _on_off(flag: bool) -> str:
    return "on" if flag else "off"
