"""Plan a plain Lightning project's GPU memory from Python, no Hydra: ``vramkit.plan(...)``.

    import vramkit
    plan = vramkit.plan(MyModule, MyDataModule(), hw="t4")
    print(plan.train.batch_size, plan.train.peak_gib, plan.fits)

The module is traced on fake tensors (nothing is allocated, no GPU needed) for two optimizer
steps, a validation step inside fit and an inference step on its own (``plan.inference``: eval
mode, no training state) under the profile's CUDA rules; "auto" batch sizes (every GPU
profile's default) are searched: the largest that fit the profile's budget. ``plan.to_json()``
is what ``vramkit plan --json`` prints for the same module and data.

A Hugging Face model is planned from its config alone, with the fine-tuning options of
``vramkit plan --hf``:

    plan = vramkit.plan_hf("meta-llama/Llama-3.1-8B", hw="rtx4090_laptop", finetune="qlora",
                           lora_r=16, seq_len=2048, gradient_checkpointing=True)
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import lightning as L
import torch
from omegaconf import OmegaConf
from torch import nn

from vramkit.core.config.source import closest
from vramkit.core.hardware.detect import load_profile_file
from vramkit.core.hardware.profile import (
    HardwareProfile,
    ProfileError,
    ProfileSource,
    validate_profile,
)
from vramkit.core.planner import (
    MemoryPlan,
    PhasePlan,
    PlanRequest,
    RunSetup,
    plan_json,
    plan_table,
    plan_task,
    requested_batch_sizes,
)
from vramkit.core.planner.request import ModelOverrides, ModuleFactory
from vramkit.core.planner.tracing.batches import PhaseSamples, sample_batches
from vramkit.core.planner.tracing.sharding import sharding_of
from vramkit.core.run.settling.resolvers import CONF_DIR
from vramkit.core.units import GIB
from vramkit.finetune_options import FinetuneOptions

ModuleSource = L.LightningModule | Callable[[], L.LightningModule]
"""A LightningModule instance, or a class / function that builds one with no arguments."""


def profile_names() -> list[str]:
    """The hardware profiles shipped in ``conf/hw`` ("t4", "rtx4090_laptop", ...)."""
    return sorted(path.stem for path in (CONF_DIR / "hw").glob("*.yaml"))


def load_profile(name: str, changes: Mapping[str, Any] | None = None) -> HardwareProfile:
    """The hardware profile ``conf/hw/<name>.yaml``, validated, with `changes` set as the
    overrides ``hw.<key>=<value>`` would; a `ProfileError` naming the closest profile when there
    is none of that name. The one profile loader of ``vramkit plan`` (``--model`` and ``--hf``),
    `plan` and `plan_hf`."""
    names = profile_names()
    if name not in names:
        near = closest(name, names)
        hint = f"did you mean {near}? " if near else ""
        raise ProfileError(
            f"hw={name}: no such hardware profile; {hint}profiles: {', '.join(names)}"
        )
    found = load_profile_file(CONF_DIR / "hw" / f"{name}.yaml", display_root=CONF_DIR.parent)
    if not changes:
        return found.profile
    overrides = tuple(f"hw.{key}={value}" for key, value in changes.items())
    return validate_profile(
        OmegaConf.merge(found.raw, changes), ProfileSource(found.source.file, overrides)
    )


def hf_profile(name: str, common: FinetuneOptions) -> HardwareProfile:
    """The profile `name` of a Hugging Face plan, with the precision `common` replaces (the
    ``hw.precision`` override of `FinetuneOptions.common_overrides`)."""
    return load_profile(name, {"precision": common.precision} if common.precision else None)


@dataclass(frozen=True)
class Phase:
    """One phase of a plan as a user reads it (sizes in GiB)."""

    batch_size: int
    max_allocated_gib: float
    """What ``torch.cuda.max_memory_allocated()`` should read after the phase."""
    peak_gib: float
    """Device memory in use at the peak: allocations, CUDA context, workspaces, reserve."""
    fits: bool | None
    """Whether the peak stays within the profile's budget (None: a profile without a budget)."""
    breakdown: dict[str, float]
    """Parameters, gradients, optimizer state, activations, overhead and total at the peak."""
    holders: list[dict[str, Any]]
    """The largest groups of tensors live at the peak (module, kind, GiB), largest first."""
    searched: bool
    """The batch size is the largest that fits (it was "auto")."""

    @classmethod
    def of(cls, phase: PhasePlan, budget_bytes: int | None, *, searched: bool) -> Phase:
        """The user's view of the planner's `phase`."""
        holders = [
            {
                "where": h.where,
                "kind": h.kind,
                "gib": h.bytes / GIB,
                "tensors": h.tensors,
                "largest_shape": h.largest_shape,
                "dtype": h.dtype,
            }
            for h in phase.holders
        ]
        return cls(
            batch_size=phase.batch_size,
            max_allocated_gib=phase.predicted_max_allocated / GIB,
            peak_gib=phase.peak_gib,
            fits=phase.fits(budget_bytes),
            breakdown=phase.breakdown_gib(),
            holders=holders,
            searched=searched,
        )


@dataclass(frozen=True)
class Plan:
    """The plan of a module and its data on one hardware profile."""

    profile: str
    budget_gib: float | None
    fits: bool | None
    """Every phase fits the budget (None without a budget)."""
    train: Phase
    val: Phase
    """Validation inside fit: the training state (parameters, gradients, optimizer) stays."""
    inference: Phase
    """Inference alone (``eval.py``): eval mode under ``torch.inference_mode``, no gradients or
    optimizer state; the largest batch that fits when the validation batch size is "auto"."""
    memory_plan: MemoryPlan = field(repr=False, compare=False)
    """The planner's own result (remedies, setup, traces)."""

    @classmethod
    def of(cls, memory_plan: MemoryPlan) -> Plan:
        """The user's view of the planner's `memory_plan`."""
        budget = memory_plan.budget_bytes
        return cls(
            profile=memory_plan.profile.name,
            budget_gib=memory_plan.budget_gib,
            fits=memory_plan.fits,
            train=Phase.of(memory_plan.train, budget, searched=memory_plan.train_searched),
            val=Phase.of(memory_plan.val, budget, searched=memory_plan.val_searched),
            inference=Phase.of(memory_plan.inference, budget, searched=memory_plan.val_searched),
            memory_plan=memory_plan,
        )

    def to_json(self) -> dict[str, Any]:
        """The plan as one JSON object: what ``vramkit plan --json`` prints."""
        return plan_json(self.memory_plan)

    def table(self) -> str:
        """The plan as ``vramkit plan`` prints it."""
        return plan_table(self.memory_plan)


def _meta_copy(module: nn.Module) -> nn.Module:
    """A copy of `module` whose parameters and buffers live on the meta device: the planner
    replaces them with fake tensors, and the user's own module must keep its weights."""
    memo: dict[int, Any] = {}
    for tensor in itertools.chain(module.parameters(), module.buffers()):
        if id(tensor) in memo:
            continue
        meta = torch.empty_like(tensor, device="meta")
        if isinstance(tensor, nn.Parameter):
            meta = nn.Parameter(meta, requires_grad=tensor.requires_grad)
        memo[id(tensor)] = meta
    return copy.deepcopy(module, memo)


def _module_factory(module: ModuleSource) -> ModuleFactory:
    """The request's module factory for `module`. A plain module has no config keys for a
    remedy to override: its request states no LoRA option (`ModelFacts.lora_defaults`), so the
    planner asks for none."""
    if isinstance(module, nn.Module):
        instance = module

        def copy_of_instance(overrides: ModelOverrides) -> L.LightningModule:
            return _meta_copy(instance)

        return copy_of_instance
    if callable(module):
        build = module

        def built(overrides: ModelOverrides) -> L.LightningModule:
            return build()

        return built
    raise TypeError(
        "module must be a LightningModule or a function that builds one, "
        f"got {type(module).__name__}"
    )


def _first_sample(batch: Any) -> Any:
    """The first sample of an example batch, still batched (batch size 1)."""
    if isinstance(batch, torch.Tensor):
        return batch[:1] if batch.dim() else batch
    if isinstance(batch, Mapping):
        return {key: _first_sample(value) for key, value in batch.items()}
    if isinstance(batch, (list, tuple)):
        if batch and not any(isinstance(v, (torch.Tensor, Mapping, list, tuple)) for v in batch):
            return type(batch)(batch[:1])  # per-sample annotations (names, polygons)
        return type(batch)(_first_sample(value) for value in batch)
    return batch


def _samples(data: Any) -> PhaseSamples:
    if isinstance(data, L.LightningDataModule):
        return sample_batches(data)
    if data is None:
        raise TypeError("data must be a LightningDataModule or an example batch, got None")
    sample = _first_sample(data)
    return PhaseSamples(train=sample, val=sample, train_size=None, val_size=None)


def plan(
    module: ModuleSource,
    data: Any,
    *,
    hw: str | HardwareProfile = "t4",
    batch_size: int | str | None = None,
    val_batch_size: int | str | None = None,
    remedies: bool = True,
) -> Plan:
    """Plan `module` (a LightningModule, or a class / function building one with no arguments)
    on `data` (a LightningDataModule, or an example batch as `training_step` receives it).

    `hw` is a profile name of ``conf/hw`` or a `HardwareProfile`. Batch sizes default to the
    profile's ("auto": the largest that fits, capped by the dataset's length); an int plans
    that size. `remedies` proposes settings that fit when the plan does not. A module instance
    is copied without its weights; the instance itself is not changed.
    """
    profile = load_profile(hw) if isinstance(hw, str) else hw
    train_size, val_size = requested_batch_sizes(profile, train=batch_size, val=val_batch_size)
    factory = _module_factory(module)
    samples = _samples(data)
    request = PlanRequest(
        module=factory,
        data=lambda: samples,
        profile=profile,
        # Lightning's own trainer: no strategy given, "auto" on the profile's processes.
        setup=RunSetup.from_profile(profile).replace(sharding=sharding_of({}, profile.world_size)),
        train_batch_size=train_size,
        val_batch_size=val_size,
        with_remedies=remedies,
    )
    return Plan.of(plan_task(request))


HF_TASKS = {  # task: the model config of conf/model and the data config it pairs with
    "causal_lm": ("hf_causal_lm", "hf_random_tokens"),
    "masked_lm": ("hf_masked_lm", "hf_random_tokens"),
    "seq_cls": ("hf_seq_cls", "hf_random_tokens"),
    "image_cls": ("hf_image_cls", "hf_random_images"),
}
"""The tasks of a Hugging Face plan without fine-tuning options (``task=hf_models``)."""


def hf_overrides(
    name: str,
    *,
    hw: str,
    task: str = "causal_lm",
    seq_len: int | None = None,
    finetune: FinetuneOptions | None = None,
) -> list[str]:
    """The ``train.py`` overrides that plan the Hugging Face config `name` on profile `hw`.

    With `finetune` (a causal LM only) the run is ``task=causal_lm``, the fine-tuning workload
    (full, LoRA or QLoRA), on random tokens of `seq_len`; without, ``task=hf_models`` trains
    every weight of the ``task`` model. A bad option is a `ValueError` naming it.
    """
    if task not in HF_TASKS:
        near = closest(task, list(HF_TASKS))
        raise ValueError(f"task {task!r} is not one of {', '.join(HF_TASKS)}; did you mean {near}?")
    if seq_len is not None and task == "image_cls":
        raise ValueError(
            "--seq-len does not apply to --task image_cls: its samples are images of the model "
            "config's image_size"
        )
    if seq_len is not None and seq_len < 2:
        raise ValueError(f"--seq-len {seq_len}: a causal LM needs at least 2 tokens")
    if finetune is not None and task != "causal_lm":
        raise ValueError(
            "the fine-tuning options (--full, --lora, --qlora, ...) plan a causal LM; "
            f"--task {task} trains every weight"
        )
    overrides = [f"+hw={hw}"]
    if finetune is None:
        model, data = HF_TASKS[task]
        overrides += ["task=hf_models", f"model={model}", f"data={data}"]
    else:
        overrides += ["task=causal_lm", "model=causal_lm", "data=hf_random_tokens"]
        overrides += finetune.check().overrides()
    overrides.append(f"model.config={name}")
    if seq_len is not None:
        overrides.append(f"data.seq_len={seq_len}")
    return overrides


def plan_hf(
    name: str,
    *,
    hw: str = "t4",
    task: str = "causal_lm",
    seq_len: int | None = None,
    finetune: str | None = None,
    lora_r: int | None = None,
    lora_alpha: float | None = None,
    lora_targets: list[str] | str | None = None,
    quant_type: str | None = None,
    double_quant: bool | None = None,
    compute_dtype: str | None = None,
    gradient_checkpointing: bool = False,
    optimizer: str | None = None,
    precision: str | None = None,
    batch_size: int | None = None,
    val_batch_size: int | None = None,
    remedies: bool = True,
) -> Plan:
    """Plan the Hugging Face model `name` (a shipped checkpoint name such as
    ``meta-llama/Llama-3.1-8B``, a ``config.json`` path or a model type) on profile `hw`, from
    its config alone (nothing downloaded), as ``vramkit plan --hf`` does.

    `finetune` (``full``, ``lora``, ``qlora``) plans the ``task=causal_lm`` fine-tune with the
    LoRA options (`lora_r`, `lora_alpha`, `lora_targets`: names or ``"all-linear"``) and the
    QLoRA ones (`quant_type` nf4/fp4, `double_quant`, `compute_dtype`); `seq_len` is tokens per
    sample; `optimizer` is one of ``adamw``, ``adamw_fused``, ``adamw_8bit``,
    ``paged_adamw_8bit``, ``adafactor``; `precision` replaces the profile's (``bf16-true``, ...).
    Batch sizes default to the profile's ("auto": the largest that fits). A bad value is a
    `ValueError` naming the option and the closest valid value.
    """
    from vramkit.core.planner.request import task_batch_defaults
    from vramkit.core.run.settling.compose import compose_config, forget_composition
    from vramkit.core.run.settling.plan_request_from_config import plan_request

    options = None
    lora_options = (lora_r, lora_alpha, lora_targets, quant_type, double_quant, compute_dtype)
    if finetune is not None or any(value is not None for value in lora_options):
        targets = [lora_targets] if isinstance(lora_targets, str) else lora_targets
        options = FinetuneOptions(
            method=finetune or ("qlora" if quant_type or compute_dtype else "lora"),
            lora_r=lora_r,
            lora_alpha=lora_alpha,
            lora_targets=None if targets is None else tuple(targets),
            quant_type=quant_type,
            double_quant=double_quant,
            compute_dtype=compute_dtype,
        )
    common = FinetuneOptions(
        gradient_checkpointing=gradient_checkpointing, optimizer=optimizer, precision=precision
    ).check()
    profile = hf_profile(hw, common)  # a mistake there is refused before the model is built
    overrides = hf_overrides(name, hw=hw, task=task, seq_len=seq_len, finetune=options)
    overrides += common.common_overrides()
    try:
        cfg = compose_config("train", overrides)
        sizes = requested_batch_sizes(
            profile, task_batch_defaults(cfg), train=batch_size, val=val_batch_size
        )
        memory_plan = plan_task(
            plan_request(cfg, profile, batch_sizes=sizes, with_remedies=remedies)
        )
    finally:
        forget_composition()  # a later composition must not see this plan's Hydra settings
    return Plan.of(memory_plan)
