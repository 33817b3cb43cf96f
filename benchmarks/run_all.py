"""``make bench``: every benchmark in turn, each in its own process; then a summary table.

Each writes its JSON under ``benchmarks/results/``. A benchmark that fails (an error, or the
evaluation's results differing from the reference) makes the whole run fail; a number that
misses its target does not: the JSON files say so and the table shows it.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Sequence

from benchmarks.record import REPO_ROOT, RESULTS_DIR

BENCHMARKS = (
    "evaluation",
    "data_pipeline",
    "overhead",
    "step_overhead",
    "validation_ratio",
    "planner_field",
    "plan_speed",
    "inference",
    "eval_batch_plan",
)


def _headline(name: str, results: dict) -> tuple[str, str, bool]:
    """(value, target, met) of one result file's main number."""
    if name == "evaluation":
        return (
            f"{results['speedup']}x faster",
            f">= {results['target_speedup']}x",
            results["speedup"] >= results["target_speedup"],
        )
    if name == "data_pipeline":
        datasets = {
            key: value
            for key, value in results.items()
            if isinstance(value, dict) and "samples_per_core_s" in value
        }
        rates = {key: value["samples_per_core_s"] for key, value in datasets.items()}
        text = ", ".join(
            f"{key} {value['samples_per_core_s']}/s ({value['loader_samples_per_core_s']} loader)"
            for key, value in datasets.items()
        )
        target = results["target_samples_per_core_s"]
        return text + " per core", f">= {target:.0f}/s", min(rates.values()) >= target
    if name == "overhead":
        noise = ""
        if "steady_step_overhead_pct" in results:
            noise = (
                f" (steady-state steps {results['steady_step_overhead_pct']}%, plain loop's "
                f"own spread {results['plain_spread_pct']}%)"
            )
        if "overhead_over_plain_loop_pct" in results:
            noise += f"; {results['overhead_over_plain_loop_pct']}% over a plain loop"
        return (
            f"{results['overhead_pct']}% over bare Lightning, paired median{noise}",
            f"<= {results['target_overhead_pct']}%",
            results["overhead_pct"] <= results["target_overhead_pct"],
        )
    if name == "step_overhead":
        return (
            f"+{results['vramkit_minus_lightning_us']} us/step over Lightning; guard "
            f"{results['guard_us_per_param_tensor']} us per parameter tensor",
            f"<= {results['target_vramkit_minus_lightning_us']:g} us / "
            f"{results['target_guard_us_per_param_tensor']:g} us",
            results["targets_met"],
        )
    if name == "planner_field":
        allocated = results["allocated"]
        return (
            f"median |error| {allocated['median_abs_error_pct']}%, worst "
            f"{allocated['worst_abs_error_pct']}% ({results['cases']} cases; OOM "
            f"{results['oom_verdicts_correct']}/{results['oom_cases']})",
            f"<= {results['target_median_abs_error_pct']:.0f}% / "
            f"{results['target_worst_abs_error_pct']:.0f}%",
            results["targets_met"],
        )
    if name == "plan_speed":
        llm = [case for case in ("llm_8b_qlora", "llm_1b") if case in results]
        return (
            f"plan CPU {results['default']['median_cpu_s']} s default (imports alone "
            f"{results['default']['median_import_floor_cpu_s']} s), "
            f"{results['phi']['median_cpu_s']} s Phi-1.5 with remedies"
            + "".join(f", {results[case]['median_cpu_s']} s {case}" for case in llm),
            f"<= {results['default']['target_cpu_s']:g} / {results['phi']['target_cpu_s']:g}"
            + "".join(f" / {results[case]['target_cpu_s']:g}" for case in llm)
            + " s",
            results["targets_met"],
        )
    if name == "inference":
        # One thread each: with more threads on a loaded machine PyTorch's OpenMP spinning, not
        # onnxruntime, makes the difference (benchmarks/inference.py).
        single = {
            case: speeds
            for case, speeds in results["speedup_over_pytorch"].items()
            if case.endswith(" 1t")
        } or results["speedup_over_pytorch"]
        int8 = [speeds["onnxruntime_int8_static"] for speeds in single.values()]
        return (
            f"int8 {min(int8)}-{max(int8)}x over PyTorch ({len(int8)} cases, 1 thread)",
            f">= {results['target_speedup']}x",
            max(int8) >= results["target_speedup"],
        )
    if name == "eval_batch_plan":
        cases = results["cases"]
        same = sum(case["eval_batch"] == case["full_plan_eval_batch"] for case in cases)
        speedups = [case["full"]["median_s"] / case["inference"]["median_s"] for case in cases]
        return (
            f"eval batch as the full plan's in {same}/{len(cases)} cases, inference plan "
            f"{min(speedups):.1f}-{max(speedups):.1f}x faster",
            "same, faster",
            same == len(cases) and min(speedups) > 1,
        )
    return (
        f"{results['val_train_time_ratio']}",
        f"<= {results['target_ratio']}",
        results["meets_target"],
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmarks named (all by default); returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.run_all", description=__doc__)
    parser.add_argument("names", nargs="*", help=f"a subset to run, of: {', '.join(BENCHMARKS)}")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.names) - set(BENCHMARKS))
    if unknown:
        parser.error(f"unknown benchmark {unknown[0]!r}; known: {', '.join(BENCHMARKS)}")
    names = args.names or list(BENCHMARKS)
    started = time.perf_counter()
    failed = []
    for name in names:
        print(f"== {name}", flush=True)
        begun = time.perf_counter()
        status = subprocess.run(
            [sys.executable, "-m", f"benchmarks.{name}"], cwd=REPO_ROOT
        ).returncode
        print(
            f"== {name}: {'ok' if status == 0 else f'FAILED ({status})'} "
            f"in {time.perf_counter() - begun:.0f} s",
            flush=True,
        )
        if status:
            failed.append(name)
    print(f"\n{'benchmark':<18} {'result':<44} {'target':<10} met")
    for name in names:
        path = RESULTS_DIR / f"{name}.json"
        if name in failed or not path.is_file():
            print(f"{name:<18} {'FAILED':<44}")
            continue
        value, target, met = _headline(name, json.loads(path.read_text())["results"])
        print(f"{name:<18} {value:<44} {target:<10} {'yes' if met else 'NO'}")
    print(f"\nall benchmarks: {time.perf_counter() - started:.0f} s; results in {RESULTS_DIR}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
