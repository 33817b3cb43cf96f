"""The memory planner against GPU memory measured by other people, replayed from their settings.

Every file in ``benchmarks/field_cases/`` is one published measurement (a documentation page, a
benchmark report, an issue's ``CUDA out of memory`` message) with its source, GPU, model config,
batch, sequence length, precision, optimizer and the measured figure and its kind. Each case is
replayed on this machine, no GPU needed: the model is built from its transformers config (random
weights on fake tensors, nothing downloaded) by ``vramkit.tasks.hf_models`` and traced by
``MemoryPlanner`` under the case's settings and the GPU's CUDA rules. Like is compared with like:

- ``max_allocated`` (``torch.cuda.max_memory_allocated``): the predicted max allocated (the traced
  peak plus the cuBLAS workspaces the allocator hands out);
- ``max_reserved``: that plus the allocator's reserve (everything but the CUDA context);
- ``nvml`` (``nvidia-smi`` / pynvml "used"): everything, the CUDA context included;
- ``oom_lower_bound`` (``already allocated`` + ``Tried to allocate`` of an OOM message): the
  predicted allocated peak must exceed it, and the run must be planned as not fitting the GPU at
  its batch and as fitting at the batch that worked, when the source says which.

    python -m benchmarks.planner_field [--case ID ...] [--no-write]

writes ``benchmarks/results/planner_field.json`` (per case: predicted, measured, error; median and
worst |error| over the ``max_allocated`` figures against the targets, 10% and 25%) and prints a
table. CPU only; a few minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from packaging.version import InvalidVersion, Version

from benchmarks.model_code import ensure_release
from benchmarks.record import REPO_ROOT, write_result
from vramkit.core.planner.cuda.cuda_rules import DeviceRules
from vramkit.core.planner.decisions.plan import PHASES, MemoryPlanner, PhasePlan
from vramkit.core.planner.tracing.batches import PhaseSamples, sample_batches
from vramkit.core.planner.tracing.run_setup import RunSetup
from vramkit.core.quantization.bitsandbytes_rules import bitsandbytes_rules_of
from vramkit.core.run.settling.plan_request_from_config import module_factory
from vramkit.core.units import GIB

NAME = "planner_field"
CASES_DIR = REPO_ROOT / "benchmarks" / "field_cases"
TARGET_MEDIAN_PCT = 10.0
TARGET_WORST_PCT = 25.0
MODULE_TARGET = "vramkit.tasks.hf_models.module.HFModelModule"
LLM_MODULE_TARGET = "benchmarks.llm_replica.LLMReplicaModule"
METHODS = ("full", "lora", "qlora")
"""`method` (optional) of an LLM fine-tuning case: its group in the summary."""
UNDER_PLAN_LIMIT_PCT = -5.0
"""No case may be planned lower than this signed error: an under-plan is an OOM the plan hid."""
KINDS = ("max_allocated", "max_reserved", "nvml", "oom_lower_bound")
UNITS = {"MiB": 2**20, "MB": 10**6, "GiB": 2**30, "GB": 10**9}
REQUIRED = {
    "id": str,
    "title": str,
    "source": dict,
    "gpu": dict,
    "frameworks": dict,
    "model": dict,
    "run": dict,
    "measured": list,
    "not_stated": list,
    "notes": str,
}
GPU_KEYS = ("name", "memory", "memory_gib", "compute_capability", "flash_attention")
MODEL_KEYS = ("config", "config_overrides", "task", "num_labels", "attn_implementation", "loss")
RUN_KEYS = (
    "phase",
    "batch_size",
    "accumulate_grad_batches",
    "seq_len",
    "image_size",
    "precision",
    "optimizer",
    "optimizer_layout",
    "gradient_checkpointing",
)
FROM_PRETRAINED = "from_pretrained"
"""`run.weights_loading` (optional) of a case whose weights transformers' `from_pretrained` put on
the device (a tied weight loaded once per name, then tied); by default Lightning moves them."""
WEIGHTS_LOADINGS = ("module_to", FROM_PRETRAINED)
# A GPU whose capability the source leaves out (ROCm) is planned as an sm_80-class device.
_DEFAULT_CAPABILITY = (8, 0)


def load_cases(directory: Path = CASES_DIR) -> list[dict[str, Any]]:
    """Every case file, sorted by name."""
    return [json.loads(path.read_text()) for path in sorted(Path(directory).glob("*.json"))]


def case_problems(case: dict[str, Any]) -> list[str]:
    """What is missing or malformed in one case (empty when it is complete)."""
    problems = []
    for key, kind in REQUIRED.items():
        if not isinstance(case.get(key), kind):
            problems.append(f"{key}: missing or not a {kind.__name__}")
    if problems:
        return problems
    source = case["source"]
    if not source.get("url") and not (source.get("repo") and source.get("path")):
        problems.append("source: needs a url, or a repo and a path")
    if not source.get("quote"):
        problems.append("source.quote: the figure as the source prints it")
    for key in GPU_KEYS:
        if key not in case["gpu"]:
            problems.append(f"gpu.{key}: missing (write null and list it in not_stated)")
    for key in MODEL_KEYS:
        if key not in case["model"]:
            problems.append(f"model.{key}: missing")
    for key in RUN_KEYS:
        if key not in case["run"]:
            problems.append(f"run.{key}: missing")
    if case["run"].get("phase") not in PHASES:
        problems.append(f"run.phase: one of {', '.join(PHASES)}")
    if case.get("method", "full") not in METHODS:
        problems.append(f"method: one of {', '.join(METHODS)}")
    if case["run"].get("weights_loading", "module_to") not in WEIGHTS_LOADINGS:
        problems.append(f"run.weights_loading: one of {', '.join(WEIGHTS_LOADINGS)}")
    if "_target_" not in (case["run"].get("optimizer") or {}):
        problems.append("run.optimizer: a _partial_ optimizer node with _target_")
    if not case["measured"] and case.get("oom") is None:
        problems.append("measured: at least one figure (or an oom record)")
    for index, figure in enumerate(case["measured"]):
        if figure.get("kind") not in KINDS:
            problems.append(f"measured[{index}].kind: one of {KINDS}")
        if not isinstance(figure.get("value"), (int, float)) or figure["value"] <= 0:
            problems.append(f"measured[{index}].value: a positive number")
        if figure.get("unit") not in UNITS:
            problems.append(f"measured[{index}].unit: one of {sorted(UNITS)}")
        if not figure.get("what"):
            problems.append(f"measured[{index}].what: how it was measured")
    oom = case.get("oom")
    if oom is not None:
        for key in ("oom_batch_size", "worked_batch_size", "capacity_gib", "message"):
            if key not in oom:
                problems.append(f"oom.{key}: missing")
        if case["run"].get("batch_size") != oom.get("oom_batch_size"):
            problems.append("oom.oom_batch_size: must be run.batch_size")
    return problems


def model_config(case: dict[str, Any]) -> DictConfig:
    """The hf_models module config that rebuilds the case's model and optimizer."""
    model, run = case["model"], case["run"]
    llm = model.get("llm")
    return OmegaConf.create(
        {
            "_target_": MODULE_TARGET if llm is None else LLM_MODULE_TARGET,
            "task": model["task"],
            "config": model["config"],
            "config_overrides": model["config_overrides"],
            "num_labels": model["num_labels"],
            "attn_implementation": model["attn_implementation"],
            "loss": model["loss"],
            "optimizer": run["optimizer"],
            **(llm or {}),
        }
    )


def phase_samples(case: dict[str, Any]) -> PhaseSamples:
    """One random sample per phase with the case's sequence length or image size."""
    from vramkit.tasks.hf_models.data import RandomImageDataModule, RandomTokenDataModule

    loader = {"batch_size": 1, "val_batch_size": 1, "train_size": 1, "val_size": 1}
    model, run = case["model"], case["run"]
    if model["task"] == "image_cls":
        datamodule = RandomImageDataModule(
            image_size=run["image_size"], num_labels=model["num_labels"], **loader
        )
    else:
        datamodule = RandomTokenDataModule(
            task=model["task"],
            seq_len=run["seq_len"],
            num_labels=model["num_labels"] or 2,
            **loader,
        )
    return sample_batches(datamodule)


def run_setup(case: dict[str, Any]) -> RunSetup:
    """The case's precision, optimizer layout, checkpointing and accumulation on its GPU."""
    gpu, run = case["gpu"], case["run"]
    capability = _DEFAULT_CAPABILITY
    if gpu.get("compute_capability"):
        major, minor = str(gpu["compute_capability"]).split(".")
        capability = (int(major), int(minor))
    device = DeviceRules(
        capability=capability,
        flash_attention=bool(gpu["flash_attention"]),
        mem_efficient_attention=bool(gpu.get("mem_efficient_attention", True)),
        lazy_module_loading=bool(gpu.get("lazy_module_loading", True)),
    )
    return RunSetup(
        precision=run["precision"],
        device=device,
        optimizer=run["optimizer_layout"],
        gradient_checkpointing=run["gradient_checkpointing"],
        accumulate_grad_batches=run["accumulate_grad_batches"],
    )


def predicted_bytes(kind: str, plan: PhasePlan, setup: RunSetup) -> int:
    """What the plan says a figure of `kind` reads."""
    if kind in ("max_allocated", "oom_lower_bound"):
        return plan.predicted_max_allocated
    if kind == "max_reserved":
        return plan.peak - setup.device.cuda_context_bytes()
    if kind == "nvml":
        return plan.peak
    raise ValueError(f"unknown measurement kind {kind!r}")


def _settings(case: dict[str, Any]) -> str:
    run = case["run"]
    size = f"{run['image_size']}px" if run.get("image_size") else f"{run['seq_len']} tok"
    extras = [run["precision"], run["optimizer"]["_target_"].rsplit(".", 1)[-1]]
    if run["optimizer_layout"] != "configured":
        extras[-1] = run["optimizer_layout"]
    if run["accumulate_grad_batches"] > 1:
        extras.append(f"acc {run['accumulate_grad_batches']}")
    if run["gradient_checkpointing"]:
        extras.append("ckpt")
    if case["model"]["attn_implementation"]:
        extras.append(case["model"]["attn_implementation"])
    llm = case["model"].get("llm") or {}
    if llm.get("lora"):
        extras.append(f"LoRA r{llm['lora']['r']}")
    quantization = llm.get("quantization")
    if quantization:
        kind = quantization.get("quant_type", "nf4") if quantization["kind"] == "4bit" else "int8"
        extras.append(kind + ("-dq" if quantization.get("double_quant", True) else ""))
    return f"{case['model']['config']} {case['model']['task']} b{run['batch_size']} x {size}, " + (
        ", ".join(extras)
    )


def stated_bitsandbytes(case: dict[str, Any]) -> str | None:
    """The bitsandbytes release a case states (``frameworks.bitsandbytes``), if it is a version."""
    stated = case["frameworks"].get("bitsandbytes")
    try:
        return str(Version(stated)) if stated else None
    except InvalidVersion:
        return None


def replay(case: dict[str, Any]) -> dict[str, Any]:
    """Plan one case; its comparisons (and its OOM verdict) as JSON-ready numbers. A case that
    states its bitsandbytes release is planned with that release's rules."""
    version = stated_bitsandbytes(case)
    if version is None:
        return _replay(case)
    with bitsandbytes_rules_of(version):
        return _replay(case)


def _replay(case: dict[str, Any]) -> dict[str, Any]:
    started = time.perf_counter()
    run = case["run"]
    setup = run_setup(case)
    planner = MemoryPlanner(
        module_factory(model_config(case)),
        phase_samples(case),
        tied_loaded_twice=run.get("weights_loading") == FROM_PRETRAINED,
    )
    plan = planner.measure(run["phase"], run["batch_size"], setup)
    comparisons = []
    for figure in case["measured"]:
        measured = figure["value"] * UNITS[figure["unit"]]
        predicted = predicted_bytes(figure["kind"], plan, setup)
        row = {
            "kind": figure["kind"],
            "measured_gib": round(measured / GIB, 3),
            "predicted_gib": round(predicted / GIB, 3),
        }
        if figure["kind"] == "oom_lower_bound":
            row["predicted_exceeds"] = predicted > measured
        else:
            row["error_pct"] = round(100.0 * (predicted - measured) / measured, 1)
            if plan.llm_activation_allowance:
                # What the plan would read without the allowance's bytes (its reserve not
                # re-modelled): how much of the agreement the allowance carries.
                bare = predicted - plan.llm_activation_allowance
                row["error_without_allowance_pct"] = round(100.0 * (bare - measured) / measured, 1)
        comparisons.append(row)
    result: dict[str, Any] = {
        "id": case["id"],
        "method": case.get("method"),
        "source": case["source"].get("url") or case["source"]["repo"],
        "source_repo": case["source"].get("repo"),
        "transformers": _installed_transformers(),
        "gpu": case["gpu"]["name"],
        "settings": _settings(case),
        "peak_at": plan.peak_at,
        "attention_kernels": list(plan.attention_kernels),
        "bitsandbytes_rules": plan.bitsandbytes.version if plan.bitsandbytes else None,
        "llm_allowance_gib": round(plan.llm_activation_allowance / GIB, 3),
        "comparisons": comparisons,
    }
    oom = case.get("oom")
    if oom is not None:
        capacity = int(oom["capacity_gib"] * GIB)
        verdict = {
            "capacity_gib": oom["capacity_gib"],
            "oom_batch_size": oom["oom_batch_size"],
            "oom_batch_peak_gib": round(plan.peak / GIB, 3),
            "oom_batch_planned_not_fitting": plan.peak > capacity,
            "worked_batch_size": oom["worked_batch_size"],
        }
        if oom["worked_batch_size"] is not None:
            worked = planner.measure(run["phase"], oom["worked_batch_size"], setup)
            verdict["worked_batch_peak_gib"] = round(worked.peak / GIB, 3)
            verdict["worked_batch_planned_fitting"] = worked.peak <= capacity
        verdict["correct"] = verdict["oom_batch_planned_not_fitting"] and verdict.get(
            "worked_batch_planned_fitting", True
        )
        result["oom_verdict"] = verdict
    result["seconds"] = round(time.perf_counter() - started, 1)
    return result


def _summary(errors: list[float]) -> dict[str, Any]:
    if not errors:
        return {"count": 0}
    absolute = [abs(error) for error in errors]
    return {
        "count": len(errors),
        "median_abs_error_pct": round(statistics.median(absolute), 1),
        "worst_abs_error_pct": round(max(absolute), 1),
    }


def _signed(errors: list[float]) -> dict[str, Any]:
    if not errors:
        return {"count": 0}
    return {
        **_summary(errors),
        "median_signed_error_pct": round(statistics.median(errors), 1),
        "lowest_signed_error_pct": round(min(errors), 1),
        "under_planned_beyond_limit": sum(error < UNDER_PLAN_LIMIT_PCT for error in errors),
    }


def by_method(results: list[dict[str, Any]], key: str = "method") -> dict[str, Any]:
    """Signed errors of the LLM fine-tuning cases (those with a `method`), per `key` of their
    results (``method``, or ``source_repo``: which project published them) and all."""
    groups: dict[str, list[float]] = {}
    for result in results:
        if not result.get("method"):
            continue
        for row in result["comparisons"]:
            if "error_pct" in row:
                if result.get(key) is not None:
                    groups.setdefault(result[key], []).append(row["error_pct"])
                groups.setdefault("all", []).append(row["error_pct"])
    return {name: _signed(errors) for name, errors in sorted(groups.items())}


def summarize(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Median and worst |error| (allocated peaks, and every kind), OOM verdicts, targets, and
    the LLM cases' signed errors by method."""
    by_kind: dict[str, list[float]] = {}
    for result in results:
        for row in result["comparisons"]:
            if "error_pct" in row:
                by_kind.setdefault(row["kind"], []).append(row["error_pct"])
    allocated = _summary(by_kind.get("max_allocated", []))
    oom = [result for result in results if "oom_verdict" in result]
    bounds = [
        row["predicted_exceeds"]
        for result in results
        for row in result["comparisons"]
        if "predicted_exceeds" in row
    ]
    met = bool(
        allocated["count"]
        and allocated["median_abs_error_pct"] <= TARGET_MEDIAN_PCT
        and allocated["worst_abs_error_pct"] <= TARGET_WORST_PCT
    )
    return {
        "cases": len(results),
        "allocated": allocated,
        "by_kind": {kind: _summary(errors) for kind, errors in sorted(by_kind.items())},
        "all_kinds": _summary([error for errors in by_kind.values() for error in errors]),
        "oom_cases": len(oom),
        "oom_verdicts_correct": sum(result["oom_verdict"]["correct"] for result in oom),
        "oom_lower_bounds_exceeded": sum(bounds),
        "oom_lower_bounds": len(bounds),
        "llm_by_method": by_method(results),
        "llm_by_source": by_method(results, "source_repo"),
        "under_plan_limit_pct": UNDER_PLAN_LIMIT_PCT,
        "target_median_abs_error_pct": TARGET_MEDIAN_PCT,
        "target_worst_abs_error_pct": TARGET_WORST_PCT,
        "targets_met": met,
    }


def table(results: list[dict[str, Any]], summary: dict[str, Any]) -> str:
    """The comparison as a plain-text table."""
    lines = [
        f"{'case':<36} {'GPU':<12} {'kind':<15} {'measured':>9} {'predicted':>9} {'error':>8}",
    ]
    for result in results:
        gpu = result["gpu"].split(" (")[0].replace("Google Colab GPU, ", "Colab ")[:12]
        for row in result["comparisons"]:
            error = (
                f"{row['error_pct']:+.1f}%"
                if "error_pct" in row
                else ("exceeds" if row["predicted_exceeds"] else "BELOW")
            )
            lines.append(
                f"{result['id'][:36]:<36} {gpu:<12} {row['kind']:<15} "
                f"{row['measured_gib']:>8.2f}G {row['predicted_gib']:>8.2f}G {error:>8}"
            )
        verdict = result.get("oom_verdict")
        if verdict is not None:
            worked = (
                f"batch {verdict['worked_batch_size']} planned "
                f"{verdict['worked_batch_peak_gib']:.2f} GiB "
                f"({'fits' if verdict['worked_batch_planned_fitting'] else 'DOES NOT FIT'})"
                if verdict["worked_batch_size"] is not None
                else "no batch that worked is known"
            )
            label = "" if result["comparisons"] else result["id"][:36]
            lines.append(
                f"{label:<36} OOM at batch {verdict['oom_batch_size']}: planned "
                f"{verdict['oom_batch_peak_gib']:.2f} GiB on {verdict['capacity_gib']} GiB "
                f"({'does not fit' if verdict['oom_batch_planned_not_fitting'] else 'FITS'}); "
                f"{worked}"
            )
    allocated = summary["allocated"]
    lines.append("")
    if allocated["count"]:
        lines.append(
            f"max_allocated: median |error| {allocated['median_abs_error_pct']}% "
            f"(target <= {TARGET_MEDIAN_PCT}%), worst {allocated['worst_abs_error_pct']}% "
            f"(target <= {TARGET_WORST_PCT}%) over {allocated['count']} figures: "
            f"targets {'met' if summary['targets_met'] else 'NOT met'}"
        )
    for kind, stats in summary["by_kind"].items():
        if kind != "max_allocated":
            lines.append(
                f"{kind}: median |error| {stats['median_abs_error_pct']}%, worst "
                f"{stats['worst_abs_error_pct']}% over {stats['count']} figures"
            )
    llm_groups = [*summary["llm_by_method"].items()]
    llm_groups += [(f"from {name}", stats) for name, stats in summary["llm_by_source"].items()]
    for method, stats in [group for group in llm_groups if group[0] != "from all"]:
        signed = f"median signed {stats['median_signed_error_pct']:+.1f}%"
        lowest = f"lowest {stats['lowest_signed_error_pct']:+.1f}%"
        under = f"under-planned by more than {-UNDER_PLAN_LIMIT_PCT:.0f}%"
        lines.append(
            f"LLM {method}: median |error| {stats['median_abs_error_pct']}%, {signed}, {lowest} "
            f"over {stats['count']} figures; {under}: {stats['under_planned_beyond_limit']}"
        )
    lines.append(
        f"OOM cases: {summary['oom_verdicts_correct']} of {summary['oom_cases']} planned as not "
        f"fitting at their batch (and fitting at the batch that worked); predicted allocation "
        f"above the OOM message's lower bound in {summary['oom_lower_bounds_exceeded']} of "
        f"{summary['oom_lower_bounds']}"
    )
    return "\n".join(lines)


def _installed_transformers() -> str:
    import transformers

    return transformers.__version__


def replay_all(cases: list[dict[str, Any]], *, model_code: str) -> list[dict[str, Any]]:
    """Replay `cases` in order; with `model_code="source"`, each with the transformers release its
    case names (`frameworks.replay_transformers`), in a subprocess that imports that release."""
    by_release: dict[str, list[str]] = {}
    if model_code == "source":
        installed = _installed_transformers()
        for case in cases:
            release = case["frameworks"].get("replay_transformers")
            if release and release != installed:
                by_release.setdefault(release, []).append(case["id"])
    elsewhere: dict[str, dict[str, Any]] = {}
    for release, ids in by_release.items():
        folder = ensure_release(release)
        if folder is None:
            print(f"transformers {release} unavailable: its cases replay with the installed one")
            continue
        elsewhere.update({result["id"]: result for result in _replay_with(folder, ids)})
    results = []
    for case in cases:
        if case["id"] not in elsewhere:
            print(f"replaying {case['id']} ...", flush=True)
        results.append(elsewhere.get(case["id"]) or replay(case))
    return results


def _replay_with(folder: Path, ids: list[str]) -> list[dict[str, Any]]:
    """Replay the cases `ids` in a subprocess whose `transformers` is the one in `folder`."""
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "results.json"
        command = [sys.executable, "-m", "benchmarks.planner_field", "--model-code", "installed"]
        command += [arg for case_id in ids for arg in ("--case", case_id)]
        command += ["--no-write", "--results-to", str(out)]
        paths = [str(folder), str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}
        subprocess.run(command, check=True, env=env, cwd=REPO_ROOT, stdout=subprocess.DEVNULL)
        return json.loads(out.read_text())


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", action="append", help="replay only this case id (repeatable)")
    parser.add_argument("--no-write", action="store_true", help="do not write the result file")
    parser.add_argument(
        "--model-code",
        choices=("source", "installed"),
        default="source",
        help="source: each case with the transformers release it was measured with "
        "(frameworks.replay_transformers); installed: every case with this environment's",
    )
    parser.add_argument("--results-to", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    started = time.perf_counter()
    cases = load_cases()
    broken = {case.get("id", "?"): case_problems(case) for case in cases}
    broken = {key: value for key, value in broken.items() if value}
    if broken:
        for key, problems in broken.items():
            print(f"{NAME}: case {key}: {'; '.join(problems)}", file=sys.stderr)
        return 2
    if args.case:
        unknown = sorted(set(args.case) - {case["id"] for case in cases})
        if unknown:
            print(f"{NAME}: unknown case {unknown[0]!r}", file=sys.stderr)
            return 2
        cases = [case for case in cases if case["id"] in args.case]
    results = replay_all(cases, model_code=args.model_code)
    if args.results_to is not None:
        args.results_to.write_text(json.dumps(results))
        return 0
    summary = summarize(results)
    print(table(results, summary))
    if not args.no_write:
        numbers = {**summary, "model_code": args.model_code, "results": results}
        path = write_result(NAME, numbers, started=started)
        print(f"\nwritten {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
