"""A composed run config as the planner's `PlanRequest`: the one place a config meets the planner.

`train`, `eval`, `scripts/plan_memory.py`, ``vramkit plan --hf`` and `vramkit.plan_hf` plan a
composed config; `plan_request` reads what the planner needs from it (the model and data nodes
as factories, the trainer's strategy and length, the activation-offload callback, the LoRA
option file, the task's stated batch sizes) so that `vramkit.core.planner` reads no config.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf, open_dict

from vramkit.core.config.instantiate import instantiate
from vramkit.core.hardware.profile import HardwareProfile
from vramkit.core.planner.cuda.optimizer_layouts import BITSANDBYTES_TARGETS
from vramkit.core.planner.request import (
    ModelFacts,
    ModelOverrides,
    ModuleFactory,
    PlanRequest,
    batch_size_request,
    requested_batch_sizes,
    setup_for,
    task_batch_defaults,
)
from vramkit.core.planner.tracing.batches import PhaseSamples, sample_batches
from vramkit.core.planner.tracing.run_setup import RunSetup

_ADAM_TARGETS = ("torch.optim.AdamW", "torch.optim.Adam")
_OFFLOAD_KEY = "callbacks.activation_offload"
_LORA_OPTION = Path("model") / "lora" / "default.yaml"


def planning_config(cfg: DictConfig, profile: HardwareProfile) -> DictConfig:
    """A copy of `cfg` whose `hw` holds `profile` with integer batch sizes, for instantiation.

    The datamodule validates its batch sizes; the planner only takes one sample from it, in
    this process, so "auto" becomes 1 there and the loaders get no workers and no pinning.
    """
    planning = copy.deepcopy(cfg)
    values = profile.model_dump()
    train, val = batch_size_request(profile).sizes
    values.update(batch_size=train or 1, val_batch_size=val or 1, num_workers=0, pin_memory=False)
    with open_dict(planning):
        planning.hw = OmegaConf.create(values)
    return planning


def swap_bitsandbytes_optimizer(model_cfg: DictConfig) -> str | None:
    """Replace a bitsandbytes AdamW (8-bit and/or paged) in `model_cfg` (in place) by torch's
    AdamW with the same hyper-parameters; return the layout it is planned with (`adamw_8bit`,
    `paged_adamw`, …), None when there was none. bitsandbytes needs CUDA to build its
    optimizer; the planner needs none."""
    optimizer = model_cfg.get("optimizer")
    if not isinstance(optimizer, DictConfig):
        return None
    layout = BITSANDBYTES_TARGETS.get(optimizer.get("_target_"))
    if layout is None:
        return None
    with open_dict(optimizer):
        optimizer._target_ = "torch.optim.AdamW"
        for key in ("optim_bits", "min_8bit_size", "percentile_clipping", "block_wise", "paged"):
            optimizer.pop(key, None)
    return layout


def with_model_overrides(model_cfg: DictConfig, overrides: ModelOverrides) -> DictConfig:
    """`model_cfg`, or a copy with each ``(key, YAML value)`` of `overrides` set."""
    if not overrides:
        return model_cfg
    changed = copy.deepcopy(model_cfg)  # keeps its parent: interpolations still resolve
    with open_dict(changed):
        for key, value in overrides:
            OmegaConf.update(changed, key, yaml.safe_load(value), merge=False)
    return changed


def module_factory(model_cfg: DictConfig) -> ModuleFactory:
    """Builds the LightningModule of `model_cfg` with a remedy's model overrides applied."""

    def build(overrides: ModelOverrides) -> Any:
        return instantiate(with_model_overrides(model_cfg, overrides))

    return build


def data_factory(planning: DictConfig) -> Callable[[], PhaseSamples]:
    """One sample batch per phase from the datamodule of `planning`'s `data` node, read when
    the planner asks for the samples."""
    return lambda: sample_batches(instantiate(planning.data))


def profile_setup(cfg: DictConfig, profile: HardwareProfile) -> RunSetup:
    """The `RunSetup` `cfg`'s run has on `profile`: its precision, its trainer's strategy on
    `devices × num_nodes` processes, and activation offload.

    The trainer's own integer `devices` / `num_nodes` (e.g. trainer=ddp_sim's 2 processes) win
    over the profile's; interpolations of the profile are not resolved here (that would plan).
    """
    offload = bool(OmegaConf.select(cfg, f"{_OFFLOAD_KEY}.enabled", default=False))
    trainer = cfg.get("trainer")
    if not isinstance(trainer, DictConfig):  # Lightning's "auto"
        return setup_for(profile, {}, profile.world_size, activation_offload=offload)
    raw = OmegaConf.to_container(trainer, resolve=False)
    devices = raw.get("devices")
    nodes = raw.get("num_nodes")
    world = (devices if isinstance(devices, int) else profile.devices) * (
        nodes if isinstance(nodes, int) else profile.num_nodes
    )
    return setup_for(profile, raw, world, activation_offload=offload)


def _lora_defaults(cfg: DictConfig, model_cfg: DictConfig) -> dict[str, Any] | None:
    """``conf/model/lora/default.yaml`` for a model with a ``lora`` key left null."""
    if "lora" not in model_cfg or model_cfg.get("lora") is not None:
        return None
    conf_dir = OmegaConf.select(cfg, "paths.conf_dir", default=None)
    option = Path(conf_dir) / _LORA_OPTION if conf_dir else None
    if option is None or not option.is_file():
        return None
    return OmegaConf.to_container(OmegaConf.load(option))


def model_facts(cfg: DictConfig, model_cfg: DictConfig) -> ModelFacts:
    """What the remedies need to know of `cfg`'s model. `model_cfg` is its planning copy
    (`planning_config`): a bitsandbytes optimizer there is swapped for torch's AdamW
    (`swap_bitsandbytes_optimizer`), as the planner builds it."""
    optimizer = model_cfg.get("optimizer")
    configured = isinstance(optimizer, DictConfig) and "_target_" in optimizer
    name = str(optimizer._target_).rsplit(".", 1)[-1] if configured else ModelFacts.optimizer
    bitsandbytes = swap_bitsandbytes_optimizer(model_cfg)
    target = optimizer.get("_target_") if isinstance(optimizer, DictConfig) else None
    checkpointing = None
    if "gradient_checkpointing" in model_cfg:
        checkpointing = model_cfg.get("gradient_checkpointing") is True
    return ModelFacts(
        optimizer=name,
        adam=target in _ADAM_TARGETS,
        bitsandbytes_optimizer=bitsandbytes,
        gradient_checkpointing=checkpointing,
        lora_defaults=_lora_defaults(cfg, model_cfg),
        activation_offload_available=OmegaConf.select(cfg, _OFFLOAD_KEY) is not None,
    )


def _trainer_length(cfg: DictConfig) -> tuple[int, int]:
    trainer = cfg.get("trainer") or {}
    max_epochs = trainer.get("max_epochs") or 1
    max_steps = trainer.get("max_steps")
    return int(max_epochs), int(max_steps) if max_steps is not None else -1


def plan_request(
    cfg: DictConfig,
    profile: HardwareProfile,
    *,
    batch_sizes: tuple[int | None, int | None] | None = None,
    with_remedies: bool = True,
    setup: RunSetup | None = None,
    samples: PhaseSamples | None = None,
) -> PlanRequest:
    """The request that plans `cfg`'s run on `profile`.

    `batch_sizes` (train, val) are planned as given, None searched; by default they are the
    profile's, "auto" interpreted by `requested_batch_sizes`. `setup` defaults to the one `cfg`
    runs with on `profile` (`profile_setup`); `samples` to one per phase from `cfg.data`.
    """
    defaults = task_batch_defaults(cfg)
    if batch_sizes is None:
        batch_sizes = requested_batch_sizes(profile, defaults)
    planning = planning_config(cfg, profile)
    facts = model_facts(cfg, planning.model)
    max_epochs, max_steps = _trainer_length(planning)
    return PlanRequest(
        module=module_factory(planning.model),
        data=data_factory(planning) if samples is None else lambda: samples,
        profile=profile,
        setup=profile_setup(cfg, profile) if setup is None else setup,
        train_batch_size=batch_sizes[0],
        val_batch_size=batch_sizes[1],
        with_remedies=with_remedies,
        model=facts,
        max_epochs=max_epochs,
        max_steps=max_steps,
        task_batch_defaults=defaults,
    )
