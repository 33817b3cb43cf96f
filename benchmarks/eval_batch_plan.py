"""`eval.py`'s auto batch: the inference-only plan against the full plan, per model and profile.

For each case of `CASES` (DBNet on the synthetic set, 100 validation images) this measures the
eval batch the inference plan chooses, its planned peak and the profile's budget, the traces
run, and the wall time of two calls, each in its own process:

- ``inference``: `plan_inference_batch_size` of `plan_request(cfg, profile, batch_sizes=(1,
  None))`, what `eval.py` runs for ``hw.val_batch_size: auto`` (the inference phase alone);
- ``full``: `plan_task` of `plan_request(cfg, profile, batch_sizes=(None, None),
  with_remedies=False)`, train, validation inside fit and inference.

``cfg`` is `compose_config("eval", ["+hw=<profile>", "model=<model>",
"data.val_image_size=<side>"])` and ``profile`` is ``conf/hw/<profile>.yaml``. The time is the
call's wall time (one sample per split loaded, the model built, every trace; imports and
composition not counted). The two calls alternate (the order flips every round), ``--rounds``
rounds, since the shared host's speed drifts within minutes; each result keeps every round, the
median and the min-max, and the file records the load and the CPU steal over the whole run.
The synthetic data is rendered once under a temporary folder before any timing.

``python -m benchmarks.eval_batch_plan [--rounds N]`` writes ``results/eval_batch_plan.json``;
docs/planner.md quotes its batch sizes, peaks and traces (a test checks them) and its times.
A round is 10 processes (one more renders the data first): ``make bench`` runs one (146 s on the
loaded 2-core host), the docs' numbers come from ``--rounds 3`` (236 s).
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
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from benchmarks.record import REPO_ROOT, write_result


@dataclass(frozen=True)
class Case:
    """One row of docs/planner.md's table: a model, its validation side and a profile."""

    model: str
    side: int
    """Validation image side (px): ``data.val_image_size``."""
    profile: str

    @property
    def name(self) -> str:
        """The row's label, as the docs write it."""
        return f"{self.model}, {self.side} px, {self.profile}"

    def overrides(self, data_dir: Path) -> list[str]:
        """The eval config's overrides for this case, its data under `data_dir`."""
        return [
            f"+hw={self.profile}",
            f"model={self.model}",
            f"data.val_image_size={self.side}",
            f"paths.data_dir={data_dir}",
        ]


CASES = (
    Case("dbnet_tiny", 320, "t4"),
    Case("dbnet_r18", 320, "t4"),
    Case("dbnet_r18", 320, "rtx2060_super"),
    Case("dbnet_r18", 1280, "t4"),
    Case("dbnet_r18", 1280, "rtx2060_super"),
)
KINDS = ("inference", "full")
"""The two plans timed: the inference phase alone (`eval.py`) and the full plan."""


def plan_once(case: Case, kind: str, data_dir: Path) -> dict:
    """Plan `case` in this process the `kind` way; the chosen eval batch, its planned peak and
    the budget (GiB), the traces and the call's wall time (s)."""
    # Imported here: the parent process only starts children and needs none of it.
    from vramkit.api import load_profile
    from vramkit.core.planner import plan_task
    from vramkit.core.planner.decisions.inference_plan import plan_inference_batch_size
    from vramkit.core.run.settling.compose import compose_config
    from vramkit.core.run.settling.plan_request_from_config import plan_request
    from vramkit.core.units import GIB

    with tempfile.TemporaryDirectory() as output_dir:
        cfg = compose_config("eval", case.overrides(data_dir), output_dir=Path(output_dir) / "eval")
    profile = load_profile(case.profile)
    started = time.perf_counter()
    if kind == "inference":
        plan = plan_inference_batch_size(plan_request(cfg, profile, batch_sizes=(1, None)))
        seconds = time.perf_counter() - started
        inference, traces, budget = plan.inference, plan.traces, plan.budget_bytes
    else:
        memory = plan_task(
            plan_request(cfg, profile, batch_sizes=(None, None), with_remedies=False)
        )
        seconds = time.perf_counter() - started
        inference, traces, budget = memory.inference, memory.traces, memory.budget_bytes
    return {
        "eval_batch": inference.batch_size,
        "planned_peak_gib": round(inference.peak_gib, 2),
        "budget_gib": round(budget / GIB, 2),
        "traces": traces,
        "seconds": round(seconds, 2),
    }


def plan_in_child(case: Case, kind: str, data_dir: Path) -> dict:
    """`plan_once` in a process of its own (fresh imports and caches), as a user's call runs."""
    command = [
        sys.executable,
        "-m",
        "benchmarks.eval_batch_plan",
        "--child",
        f"{CASES.index(case)}:{kind}",
        "--data-dir",
        str(data_dir),
    ]
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}  # this checkout's vramkit
    done = subprocess.run(
        command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed ({done.returncode}):\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def summarise(case: Case, runs: dict[str, list[dict]]) -> dict:
    """One case's result from its runs per kind: the plan (which every run must agree on) and
    each kind's seconds, median and min-max."""
    inference = runs["inference"]
    chosen = {(run["eval_batch"], run["planned_peak_gib"], run["traces"]) for run in inference}
    if len(chosen) != 1:
        raise RuntimeError(f"{case.name}: the inference plan differs between runs: {chosen}")
    first = inference[0]
    result = {
        "case": case.name,
        "model": case.model,
        "val_image_size": case.side,
        "profile": case.profile,
        "eval_batch": first["eval_batch"],
        "planned_peak_gib": first["planned_peak_gib"],
        "budget_gib": first["budget_gib"],
        "full_plan_eval_batch": runs["full"][0]["eval_batch"],
    }
    for kind in KINDS:
        seconds = [run["seconds"] for run in runs[kind]]
        result[kind] = {
            "traces": runs[kind][0]["traces"],
            "seconds": seconds,
            "median_s": round(statistics.median(seconds), 2),
            "min_s": min(seconds),
            "max_s": max(seconds),
        }
    return result


def measure(
    rounds: int, data_dir: Path, plan: Callable[[Case, str, Path], dict] = plan_in_child
) -> list[dict]:
    """Every case, `rounds` rounds of both kinds alternating (the first kind flips each round),
    after one untimed plan that renders the synthetic data into `data_dir`."""
    plan(CASES[0], "inference", data_dir)
    runs = {case: {kind: [] for kind in KINDS} for case in CASES}
    for round_index in range(rounds):
        order = KINDS if round_index % 2 == 0 else KINDS[::-1]
        for case in CASES:
            for kind in order:
                runs[case][kind].append(plan(case, kind, data_dir))
    return [summarise(case, runs[case]) for case in CASES]


def table_row(result: dict) -> str:
    """The result as docs/planner.md's table row."""
    if result["eval_batch"] >= 100:
        batch = f"{result['eval_batch']}, all ({result['planned_peak_gib']:.2f} GiB)"
    else:
        batch = (
            f"{result['eval_batch']} ({result['planned_peak_gib']:.2f} of "
            f"{result['budget_gib']:.2f} GiB)"
        )

    def timing(kind: str) -> str:
        numbers = result[kind]
        return (
            f"{numbers['median_s']:.1f} s ({numbers['min_s']:.1f}–{numbers['max_s']:.1f}), "
            f"{numbers['traces']} trace{'s' if numbers['traces'] != 1 else ''}"
        )

    return f"| {result['case']} | {batch} | {timing('inference')} | {timing('full')} |"


def main(argv: Sequence[str] | None = None) -> int:
    """Measure every case (or, with ``--child``, plan one in this process) and write the file."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.eval_batch_plan", description=__doc__
    )
    parser.add_argument(
        "--rounds", type=int, default=1, help="timed rounds (default 1, for make bench's time)"
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)  # "<case index>:<kind>"
    parser.add_argument("--data-dir", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        index, kind = args.child.split(":")
        print(json.dumps(plan_once(CASES[int(index)], kind, args.data_dir)))
        return 0
    started = time.perf_counter()
    load_before = [round(value, 2) for value in os.getloadavg()]
    with tempfile.TemporaryDirectory() as data_dir:
        results = measure(args.rounds, Path(data_dir))
    for result in results:
        print(table_row(result))
    numbers = {
        "rounds": args.rounds,
        "load_average_at_start": load_before,
        "cases": results,
    }
    print(write_result("eval_batch_plan", numbers, started=started))
    return 0


if __name__ == "__main__":
    sys.exit(main())
