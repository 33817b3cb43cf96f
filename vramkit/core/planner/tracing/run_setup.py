"""What the planner simulates: the target device and the run's memory-relevant choices."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from vramkit.core.hardware.profile import HardwareProfile
from vramkit.core.planner.cuda.cuda_rules import DeviceRules, lazy_module_loading
from vramkit.core.planner.cuda.optimizer_layouts import CONFIGURED, LAYOUTS
from vramkit.core.planner.tracing.sharding import ONE_DEVICE, Sharding


@dataclass(frozen=True)
class RunSetup:
    """One way of running the task: precision, optimizer layout, checkpointing, accumulation.

    `device` holds the target GPU's rules; None plans with plain CPU semantics (no 512-byte
    rounding, no autocast emulation, no allowances), as for the `cpu` profile.
    """

    precision: str
    device: DeviceRules | None
    optimizer: str = CONFIGURED
    """An `optimizer_layouts` layout: configured, adamw_8bit, zero2 or zero2_offload."""
    gradient_checkpointing: bool = False
    accumulate_grad_batches: int = 1
    devices: int = 1
    activation_offload: bool = False
    """Tensors saved for backward go to host memory during forward (`save_on_cpu`)."""
    model_overrides: tuple[tuple[str, str], ...] = ()
    """Model config keys replaced before the module is built: (key under `model`, YAML value),
    e.g. ``(("lora", "{r: 16, ...}"),)`` for a LoRA remedy."""
    sharding: Sharding = ONE_DEVICE
    """The strategy and world size: the plan is per device of a data-parallel run (`sharding`);
    the default is one process holding everything."""

    def __post_init__(self) -> None:
        if self.optimizer not in LAYOUTS:
            raise ValueError(f"unknown optimizer layout {self.optimizer!r}; one of {LAYOUTS}")
        if self.accumulate_grad_batches < 1:
            raise ValueError(
                f"accumulate_grad_batches must be >= 1, got {self.accumulate_grad_batches}"
            )

    @classmethod
    def from_profile(cls, profile: HardwareProfile) -> RunSetup:
        """The setup a profile runs with as it stands (its precision, devices, accumulation)."""
        device = None
        if profile.accelerator == "gpu" and profile.capability is not None:
            device = DeviceRules(
                capability=profile.capability,
                flash_attention=profile.flash_attention,
                mem_efficient_attention=profile.mem_efficient_attention,
                lazy_module_loading=lazy_module_loading(),
            )
        return cls(
            precision=profile.precision,
            device=device,
            accumulate_grad_batches=profile.accumulate_grad_batches,
            devices=profile.devices,
        )

    def replace(self, **changes: object) -> RunSetup:
        """A copy with `changes` applied."""
        return dataclasses.replace(self, **changes)

    @property
    def module_key(self) -> tuple[str, bool, tuple[tuple[str, str], ...]]:
        """What decides how the module itself is built: parameter precision, checkpointing,
        model config overrides."""
        return (self.precision, self.gradient_checkpointing, self.model_overrides)
