"""A memory plan as a console table or as one JSON-ready dict (GiB throughout)."""

from __future__ import annotations

import contextlib
import importlib.metadata
from typing import Any

import torch

from vramkit.core.planner.cuda.op_rules import CUDNN_ESTIMATE_BAND
from vramkit.core.planner.cuda.tested_torch import modelled_torch, untested_torch_warning
from vramkit.core.planner.decisions.llm_allowance import LLM_ACTIVATION_ALLOWANCE
from vramkit.core.planner.decisions.plan import PhasePlan
from vramkit.core.planner.decisions.remedies import Remedy
from vramkit.core.planner.decisions.task_plan import MemoryPlan
from vramkit.core.planner.tracing.peak_holders import WORKSPACE, Holder
from vramkit.core.planner.tracing.sharding import row_notes
from vramkit.core.tables import render_table
from vramkit.core.units import GIB

_ROWS = (
    ("parameters", "parameters"),
    ("gradients", "gradients"),
    ("optimizer_state", "optimizer state"),
    ("activations", "activations + temporaries"),
    ("overhead", "context + workspaces + reserve"),
    ("total", "peak"),
)


_BREAKDOWN_WIDTH = 140
"""Characters the three-phase breakdown may take: its rows stay one line each."""


def _gib(value: float) -> float:
    return round(value, 3)


def traced_versions() -> dict[str, str]:
    """The libraries whose code the plan traced: torch, and transformers when it is installed.

    A model's saved tensors and buffers change between releases (e.g. GPT-NeoX's causal-mask
    buffers), so a plan holds for these versions; a run on others may differ.
    """
    versions = {"torch": torch.__version__}
    with contextlib.suppress(importlib.metadata.PackageNotFoundError):
        versions["transformers"] = importlib.metadata.version("transformers")
    return versions


def _phase_json(phase: PhasePlan, budget_bytes: int | None) -> dict[str, Any]:
    return {
        "batch_size": phase.batch_size,
        "accumulate_grad_batches": phase.accumulate_grad_batches,
        "peak_gib": _gib(phase.peak_gib),
        "max_allocated_gib": _gib(phase.predicted_max_allocated / GIB),
        "max_allocated_estimate_gib": _gib(phase.max_allocated_estimate / GIB),
        "fits": phase.fits(budget_bytes),
        "peak_at": phase.peak_at,
        "at_least": phase.at_least,
        "attention_kernels": list(phase.attention_kernels),
        "breakdown": {key: _gib(value) for key, value in phase.breakdown_gib().items()},
        "peak_holders": [_holder_json(holder) for holder in phase.holders],
        "max_allocated_holders": [_holder_json(holder) for holder in phase.max_allocated_holders],
    }


def _largest_workspace(phase: PhasePlan) -> Holder | None:
    """The cuDNN workspace live at the max-allocated moment, when it rises above the peak."""
    if phase.allocated_with_workspaces <= phase.allocated_peak:
        return None
    workspaces = [h for h in phase.max_allocated_holders if h.kind == WORKSPACE]
    return max(workspaces, key=lambda holder: holder.bytes, default=None)


def _holder_json(holder: Holder) -> dict[str, Any]:
    return {
        "where": holder.where,
        "kind": holder.kind,
        "gib": round(holder.bytes / GIB, 4),
        "tensors": holder.tensors,
        "largest_shape": list(holder.largest_shape),
        "dtype": holder.dtype,
    }


def peak_holders_table(phase: PhasePlan, *, rows: int = 6) -> str:
    """What holds memory at `phase`'s peak, largest first, with the library workspaces."""
    body = [
        [
            holder.where,
            holder.kind,
            f"{holder.bytes / GIB:.3f}",
            str(holder.tensors),
            f"{list(holder.largest_shape)} {holder.dtype}",
        ]
        for holder in phase.holders[:rows]
    ]
    if phase.workspace:
        body.append(["(cuBLAS)", "workspace", f"{phase.workspace / GIB:.3f}", "", ""])
    return render_table(["where", "kind", "GiB", "tensors", "largest"], body)


def _remedy_json(remedy: Remedy, budget_bytes: int | None) -> dict[str, Any]:
    return {
        "name": remedy.name,
        "how": remedy.how,
        "overrides": list(remedy.overrides),
        "note": remedy.note,
        "fits": remedy.fits,
        "train": _phase_json(remedy.train, budget_bytes),
        "val": _phase_json(remedy.val, budget_bytes),
    }


def plan_json(plan: MemoryPlan) -> dict[str, Any]:
    """The plan as plain JSON values: profile, budget_gib, fits, train, val, inference,
    remedies, …"""
    profile = plan.profile
    budget = plan.budget_bytes
    return {
        "profile": profile.name,
        "device": profile.label,
        "precision": plan.setup.precision,
        "optimizer": plan.optimizer,
        "strategy": plan.setup.sharding.strategy,
        "devices": profile.devices,
        "num_nodes": profile.num_nodes,
        "world_size": plan.setup.sharding.world_size,
        "per_device": plan.setup.sharding.sharded,
        "budget_gib": None if plan.budget_gib is None else _gib(plan.budget_gib),
        "memory_gib": profile.memory_gib,
        "fits": plan.fits,
        "train": {**_phase_json(plan.train, budget), "searched": plan.train_searched},
        "val": {**_phase_json(plan.val, budget), "searched": plan.val_searched},
        "inference": {**_phase_json(plan.inference, budget), "searched": plan.val_searched},
        "remedies": [_remedy_json(remedy, budget) for remedy in plan.remedies],
        "allowances": {
            "cuda_context_gib": (
                round(plan.setup.device.cuda_context_bytes() / GIB, 3)
                if plan.setup.device is not None
                else 0.0
            ),
            "reserve": "the step's allocations replayed through the caching allocator's rules"
            if plan.setup.device is not None
            else "none (CPU)",
            **_llm_allowance_json(plan.train),
        },
        "traces": plan.traces,
        "seconds": round(plan.seconds, 2),
        "traced_versions": traced_versions(),
        "untested_torch": untested_torch_warning(),
        "bitsandbytes": bitsandbytes_lines(
            plan.train, plan.val, *(p for r in plan.remedies for p in (r.train, r.val))
        ),
    }


def _verdict(fits: bool | None) -> str:
    return {True: "fits", False: "DOES NOT FIT", None: "no budget"}[fits]


def _batch_label(phase: PhasePlan, searched: bool, limit: int | None, budget: int | None) -> str:
    label = f"batch {phase.batch_size}"
    if phase.accumulate_grad_batches > 1:
        label += f" × {phase.accumulate_grad_batches}"
    if not searched:
        return label
    if phase.fits(budget) is False:
        return label + " (none fits)"
    return label + (" (all samples)" if phase.batch_size == limit else " (max)")


def plan_table(plan: MemoryPlan) -> str:
    """The plan as a few aligned lines for the console, remedies included."""
    profile = plan.profile
    head = (
        f"memory plan for {profile.label} ({profile.name}), {plan.setup.precision}, "
        f"{plan.optimizer}"
    )
    sharding = plan.setup.sharding
    if sharding.sharded:
        gpus = "GPU" if sharding.world_size == 1 else "GPUs"
        head += f"; per device ({sharding.world_size} {gpus}, {sharding.label})"
    if plan.budget_bytes is None:
        budget_line = "budget: none (CPU profile: host memory)"
    else:
        budget_line = (
            f"budget {plan.budget_gib:.2f} GiB = {profile.memory_budget_fraction:.0%} of "
            f"{profile.memory_gib:.1f} GiB"
        )
    budget = plan.budget_bytes
    train_label = _batch_label(plan.train, plan.train_searched, plan.train_limit, budget)
    val_label = _batch_label(plan.val, plan.val_searched, plan.val_limit, budget)
    inference_label = _batch_label(plan.inference, plan.val_searched, plan.val_limit, budget)
    phases = (("train", plan.train), ("val", plan.val), ("inference", plan.inference))
    gib = [phase.breakdown_gib() for _, phase in phases]
    notes = row_notes(plan.setup.sharding)
    rows = [
        [
            f"{title} ({notes[key]})" if key in notes else title,
            *(f"{values[key]:.3f}" for values in gib),
        ]
        for key, title in _ROWS
    ]
    rows.append(["verdict", *(_verdict(phase.fits(budget)) for _, phase in phases)])
    rows.append(["peak at", *(phase.peak_at for _, phase in phases)])
    labels = [f"train {train_label}", f"val {val_label}", f"inference {inference_label}"]
    breakdown = render_table(["GiB", *labels], rows, width=_BREAKDOWN_WIDTH)
    lines = [head, budget_line, breakdown]
    kernels = sorted({kernel for _, phase in phases for kernel in phase.attention_kernels})
    if kernels:
        lines.append(f"attention kernel on this GPU: {', '.join(kernels)}")
    for name, phase in phases:
        if phase.holders:
            lines.append("")
            lines.append(f"what holds the {name} peak ({phase.peak_at}), GiB:")
            lines.append(peak_holders_table(phase))
        workspace = _largest_workspace(phase)
        if workspace is not None:
            low, high = CUDNN_ESTIMATE_BAND
            lines.append(
                f"cuDNN workspace about {workspace.bytes / GIB:.3f} GiB in {workspace.where} "
                f"(an estimate: max_allocated {phase.predicted_max_allocated / GIB:.2f} GiB "
                f"without it, about {phase.max_allocated_estimate / GIB:.2f} with it, measured "
                f"{low:.2f}x to {high:.2f}x of that on convolutional runs; the budget keeps room "
                "for it)"
            )
    if plan.remedies:
        lines.append("")
        lines.append(
            "remedies (each re-planned; peaks in GiB, train / val; append the overrides to the "
            "command):"
        )
        for remedy in plan.remedies:
            mark = "fits" if remedy.fits else "no  "
            lines.append(
                f"  {mark}  {remedy.name}: {remedy.train.peak_text()} / {remedy.val.peak_text()}"
            )
            lines.append(f"          {remedy.how}")
            if remedy.train.at_least:
                lines.append(
                    f'          (a bound, not traced: the peak is at "{remedy.train.peak_at}", '
                    "which this change leaves as it is)"
                )
    traced = ", ".join(f"{name} {version}" for name, version in traced_versions().items())
    lines.append(
        f"({plan.traces} traces in {plan.seconds:.1f} s; traced with {traced}; {modelled_torch()})"
    )
    untested = untested_torch_warning()
    if untested is not None:
        lines.append(untested)
    remedies = [phase for remedy in plan.remedies for phase in (remedy.train, remedy.val)]
    lines.extend(bitsandbytes_lines(plan.train, plan.val, *remedies))
    lines.extend(llm_allowance_lines(plan.train, *remedies))
    return "\n".join(lines)


def _llm_allowance_json(train: PhasePlan | None) -> dict[str, float]:
    if train is None or not train.llm_activation_allowance:
        return {}
    return {"llm_activation_gib": round(train.llm_activation_allowance / GIB, 3)}


def llm_allowance_lines(*phases: PhasePlan | None) -> list[str]:
    """One line on the `LLM_ACTIVATION_ALLOWANCE` within the training peaks, when any phase (a
    remedy's included) carries it: its bytes in the first such phase and what it is."""
    carrying = [p for p in phases if p is not None and p.llm_activation_allowance]
    if not carrying:
        return []
    return [
        f"LLM activation allowance: {carrying[0].llm_activation_allowance / GIB:.2f} GiB within "
        f"the training peak ({LLM_ACTIVATION_ALLOWANCE:.0%} of its traced activations: adapter "
        "fine-tunes of causal LMs measured that much above the trace, cause not yet found; "
        "docs/planner.md)"
    ]


def bitsandbytes_lines(*phases: PhasePlan | None) -> list[str]:
    """The plan's closing lines on bitsandbytes: which release's rules it applied (when any
    phase, a remedy's included, planned quantized layers or a bitsandbytes optimizer), a warning
    outside the tested range, and the paged optimizer state planned as host memory."""
    applied = next((p.bitsandbytes for p in phases if p is not None and p.bitsandbytes), None)
    if applied is None:
        return []
    lines = [applied.footer()]
    paged = max((p.paged_optimizer_state for p in phases if p is not None), default=0)
    if paged:
        lines.append(
            f"paged optimizer state: {paged / GIB:.2f} GiB in CUDA unified memory (host), "
            "outside the device peaks above"
        )
    warning = applied.warning()
    if warning is not None:
        lines.append(warning)
    return lines
