"""Can the planner trace 2, 3 and 4 of a model's N identical blocks and carry the plan to N?

A trace costs time in proportion to the ops it dispatches, and most of a transformer's ops are
its N decoder blocks (Phi-1.5: 24), so tracing the model cut to k, k+1 and k+2 blocks and
extending every figure along the straight line they give would cut each trace about N/(2k+1)-
fold (issue #10, item 6). The plan must not change, so this benchmark checks, for every phase
measurement a plan command makes, whether that carried plan equals the full trace's, figure by
figure: bytes allocated at the peak per category, the caching-allocator model's replayed reserve
(`cuda_rules.DeviceRules.overhead_bytes`), the overhead it gives, the peak with cuDNN
workspaces, when the peak happens, and the peak-holder rows.

It runs the plan command in this process with `MemoryPlanner._trace` wrapped: each measurement
is traced whole and then with the block list cut to `SHORT_COUNTS` blocks (the plan goes on with
the whole trace, so the command makes its usual plan). A measurement counts as *affine* when
every integer figure has a zero second difference over the three counts and everything else is
equal; *exact* when the carried figures also equal the full trace's. It also checks the
allocation sequence the reserve is replayed from (`sequence_check`): whether, sizes only, the
N-block sequence is the k-block one with the chunks k+1 blocks insert repeated N-k times.

    python -m benchmarks.layer_extrapolation [--no-write] [--plan "OVERRIDES" ...]

Without `--plan` it plans Phi-1.5 on the RTX 4090 Laptop profile (`plan_speed`'s "phi" case);
it writes ``results/layer_extrapolation.json``. The finder of the block list:
`repeated_blocks` (an `nn.ModuleList` of at least 4 children of the same structure).

This was the study that showed straight lines to be wrong; the planner now rebuilds the N-block
allocation log itself (`vramkit/core/planner/tracing/block_extrapolation.py`), and this check
runs with that turned off.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import importlib.util
import io
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from benchmarks.plan_speed import CASES
from benchmarks.record import REPO_ROOT, write_result
from vramkit.core.planner.cuda import cuda_rules
from vramkit.core.planner.decisions import plan as plan_module
from vramkit.core.planner.tracing.recorder import CATEGORIES, StorageRecorder
from vramkit.core.planner.tracing.repeated_blocks import cut_to, repeated_blocks

SHORT_COUNTS = (2, 3, 4)
"""k, k+1, k+2: from k = 2 on, each block has one before and one after it, as in the model."""


def carried(values: Sequence[int], target: int) -> tuple[int, int]:
    """(second difference, value carried to `target` blocks) of `values` at `SHORT_COUNTS`."""
    first, second, third = values
    return third - 2 * second + first, third + (target - SHORT_COUNTS[-1]) * (third - second)


@dataclass
class _Figures:
    numbers: dict[str, int]
    peak_at: str
    holders: dict[tuple[str, str], int]
    """Bytes of each peak-holder row (where, kind), train or val peak."""


def _figures(plan: Any, replayed: int) -> _Figures:
    numbers = {f"allocated.{c}": plan.allocated[c] for c in CATEGORIES}
    numbers |= {
        "replayed_reserve": replayed,
        "overhead": plan.overhead,
        "allocated_with_workspaces": plan.allocated_with_workspaces,
        "peak": plan.peak,
    }
    holders = {(h.where, h.kind): h.bytes for h in plan.holders}
    return _Figures(numbers, plan.peak_at, holders)


_DERIVED = ("overhead", "peak")
"""Figures computed from others (`derive`), not carried along their own line: the overhead
rounds the reserve floor to a byte, so its own second difference can be ±1."""


def derive(numbers: dict[str, int], device: Any, backward: bool) -> dict[str, int]:
    """`numbers` with the overhead and peak computed from the carried allocations and replayed
    reserve as `cuda_rules.DeviceRules.overhead_bytes` computes them."""
    allocated = sum(numbers[f"allocated.{c}"] for c in CATEGORIES)
    if device is None:
        return {**numbers, "overhead": 0, "peak": allocated}
    in_blocks = allocated + sum(device.workspace_sizes(backward=backward))
    reserved = max(numbers["replayed_reserve"], round(cuda_rules.RESERVE_FLOOR_FACTOR * in_blocks))
    overhead = device.cuda_context_bytes() + reserved - allocated
    return {**numbers, "overhead": overhead, "peak": allocated + overhead}


def compare(
    short: Sequence[_Figures], full: _Figures, target: int, device: Any = None, train: bool = True
) -> dict:
    """Figure by figure: the three short traces, the carried value, the full trace's."""
    figures = {}
    affine = len({f.peak_at for f in short}) == 1
    exact = affine and short[-1].peak_at == full.peak_at
    guesses = {}
    for name in full.numbers:
        guesses[name] = carried([f.numbers[name] for f in short], target)[1]
    guesses = derive(guesses, device, train)
    for name, value in full.numbers.items():
        values = [f.numbers[name] for f in short]
        bend = carried(values, target)[0]
        guess = guesses[name]
        affine = affine and (bend == 0 or name in _DERIVED)
        exact = exact and guess == value
        figures[name] = {
            "short": values,
            "second_difference": bend,
            "carried": guess,
            "full": value,
            "error": guess - value,
            "relative_error": round((guess - value) / value, 6) if value else 0.0,
        }
    rows = [key for key in full.holders if all(key in f.holders for f in short)]
    wrong_rows = [
        f"{where} {kind}"
        for where, kind in full.holders
        if (where, kind) not in rows
        or carried([f.holders[where, kind] for f in short], target)[1] != full.holders[where, kind]
    ]
    return {
        "affine": affine,
        "exact": exact and not wrong_rows,
        "peak_at": {"short": [f.peak_at for f in short], "full": full.peak_at},
        "holder_rows_not_carried": wrong_rows,
        "figures": figures,
    }


def size_tokens(events: Sequence[tuple[int, int]]) -> list[tuple[str, int]]:
    """`events` ((serial, bytes) allocates, (serial, 0) frees) without their serials: which
    size is allocated or given back, in order."""
    sizes: dict[int, int] = {}
    tokens = []
    for serial, nbytes in events:
        if nbytes:
            sizes[serial] = nbytes
            tokens.append(("malloc", nbytes))
        else:
            tokens.append(("free", sizes[serial]))
    return tokens


def sequence_check(short: Sequence[Sequence], full: Sequence, target: int) -> dict:
    """Whether the allocation sequence of `target` blocks, sizes only, is the k-block one with
    the chunks that k+1 blocks insert repeated `target - k` times, the same chunks that k+2
    blocks insert again. Which block each free gives back (what the allocator's reserve also
    depends on) is not checked here."""
    tokens = [size_tokens(events) for events in short]
    first = difflib.SequenceMatcher(None, tokens[0], tokens[1], autojunk=False).get_opcodes()
    second = difflib.SequenceMatcher(None, tokens[1], tokens[2], autojunk=False).get_opcodes()
    inserted = [tokens[1][j1:j2] for tag, _, _, j1, j2 in first if tag == "insert"]
    inserts_only = all(tag in ("equal", "insert") for tag, *_ in first)
    again = [tokens[2][j1:j2] for tag, _, _, j1, j2 in second if tag == "insert"]
    built = []
    for tag, i1, i2, j1, j2 in first:
        built += (
            tokens[0][i1:i2] if tag == "equal" else tokens[1][j1:j2] * (target - SHORT_COUNTS[0])
        )
    return {
        "events": [len(events) for events in (*short, full)],
        "inserted_chunks": len(inserted),
        "inserts_only": inserts_only,
        "same_chunks_again": inserted == again,
        "sizes_carried_exactly": inserts_only and built == size_tokens(full),
    }


class ShortTraceCheck:
    """Wraps `MemoryPlanner._trace` (see the module docstring); `rows` holds one entry per
    phase measurement."""

    def __init__(self) -> None:
        self.rows: list[dict] = []
        self._count: int | None = None  # blocks to keep while tracing, None: all
        self._replayed = 0

    @contextlib.contextmanager
    def installed(self) -> Iterator[ShortTraceCheck]:
        planner = plan_module.MemoryPlanner
        trace, subject, replay = planner._trace, planner._subject, cuda_rules.replay_reserved
        holders = StorageRecorder.peak_holders
        check = self

        def every_holder(recorder, top=8, *, with_workspaces=False):
            # A short trace ranks every group: the rows of N blocks can be any of them.
            top = top if check._count is None else 1_000_000
            return holders(recorder, top, with_workspaces=with_workspaces)

        def replay_and_keep(events):
            check._replayed, check._events = replay(events), list(events)
            return check._replayed

        def cut_subject(planner_self, setup):
            made = subject(planner_self, setup)
            blocks = repeated_blocks(made.module)
            if check._count is not None and blocks is not None:
                # A measurement traces in full after its short traces: cut from here on,
                # restored by `_measure` (the module is cached across measurements).
                check._cut = cut_to(blocks, check._count)
                check._cut.__enter__()
            return made

        def measure(planner_self, phase, batch_size, setup):
            # The study compares carried figures with whole traces: none rebuilt from blocks.
            planner_self.extrapolate_blocks = False
            return check._measure(trace, planner_self, phase, batch_size, setup)

        planner._trace, planner._subject = measure, cut_subject
        cuda_rules.replay_reserved = replay_and_keep
        StorageRecorder.peak_holders = every_holder
        try:
            yield self
        finally:
            planner._trace, planner._subject = trace, subject
            cuda_rules.replay_reserved = replay
            StorageRecorder.peak_holders = holders

    def _traced(self, trace, planner, phase, batch_size, setup, count):
        self._count, self._cut = count, None
        self._replayed, self._events = 0, []
        started = time.process_time()
        try:
            plan = trace(planner, phase, batch_size, setup)
        finally:
            if self._cut is not None:
                self._cut.__exit__(None, None, None)
            self._count = None
        return plan, (self._replayed, self._events), time.process_time() - started

    def _measure(self, trace, planner, phase, batch_size, setup):
        blocks = repeated_blocks(planner._subject(setup).module)
        full, (replayed, events), full_s = self._traced(
            trace, planner, phase, batch_size, setup, None
        )
        if blocks is None or len(blocks) <= SHORT_COUNTS[-1] + 1:
            return full
        short, short_events, short_s = [], [], 0.0
        for count in SHORT_COUNTS:
            plan, (short_replayed, some_events), seconds = self._traced(
                trace, planner, phase, batch_size, setup, count
            )
            short.append(_figures(plan, short_replayed))
            short_events.append(some_events)
            short_s += seconds
        row = {
            "phase": phase,
            "batch_size": batch_size,
            "setup": _setup_name(setup),
            "blocks": len(blocks),
            "cpu_s": {"short_traces": round(short_s, 2), "full_trace": round(full_s, 2)},
        }
        row |= compare(
            short, _figures(full, replayed), len(blocks), setup.device, phase == plan_module.TRAIN
        )
        row["allocation_sequence"] = sequence_check(short_events, events, len(blocks))
        self.rows.append(row)
        return full


def _setup_name(setup: Any) -> str:
    parts = [setup.precision, f"optimizer={setup.optimizer}"]
    if setup.gradient_checkpointing:
        parts.append("gradient checkpointing")
    if setup.activation_offload:
        parts.append("activation offload")
    if setup.model_overrides:
        parts.append("model: " + ", ".join(key for key, _ in setup.model_overrides))
    if setup.sharding.strategy != "single":
        parts.append(str(setup.sharding.strategy))
    return " ".join(parts)


def run(overrides: Sequence[str]) -> list[dict]:
    """Run `scripts/plan_memory.py` with `overrides` under the check; its rows."""
    path = REPO_ROOT / "scripts" / "plan_memory.py"
    spec = importlib.util.spec_from_file_location("plan_memory", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    check = ShortTraceCheck()
    with check.installed(), contextlib.redirect_stdout(io.StringIO()):
        script.main(list(overrides))
    return check.rows


def summary(rows: Sequence[dict]) -> dict:
    """How many measurements were affine, how many of those exact, the worst errors."""
    affine = [row for row in rows if row["affine"]]
    worst: dict[str, float] = {}
    for row in affine:
        for name, figure in row["figures"].items():
            worst[name] = max(worst.get(name, 0.0), abs(figure["relative_error"]))
    return {
        "measurements": len(rows),
        "affine_on_three_counts": len(affine),
        "affine_and_exact": sum(row["exact"] for row in affine),
        "affine_but_wrong": [
            f"{row['phase']} {row['setup']}" for row in affine if not row["exact"]
        ],
        "worst_relative_error_when_affine": {k: v for k, v in worst.items() if v},
        "allocation_sizes_carried_exactly": sum(
            row["allocation_sequence"]["sizes_carried_exactly"] for row in rows
        ),
        "cpu_s_short_traces": round(sum(r["cpu_s"]["short_traces"] for r in rows), 1),
        "cpu_s_full_traces": round(sum(r["cpu_s"]["full_trace"] for r in rows), 1),
    }


def _verdict(row: dict) -> str:
    figures = row["figures"].items()
    bent = {k: f["second_difference"] for k, f in figures if f["second_difference"]}
    wrong = {k: f["error"] for k, f in figures if f["error"]}
    verdict = "exact" if row["exact"] else "affine, WRONG" if row["affine"] else "not affine"
    if row["holder_rows_not_carried"]:
        wrong["holder rows"] = row["holder_rows_not_carried"]
    sizes = row["allocation_sequence"]["sizes_carried_exactly"]
    return (
        f"{verdict}; second differences {bent}; carried - full {wrong}; "
        f"allocation sizes carried exactly: {sizes}"
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Check every measurement of each plan command; print the verdicts, write the JSON."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.layer_extrapolation", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--no-write", action="store_true", help="do not write the result file")
    parser.add_argument(
        "--plan",
        action="append",
        metavar="OVERRIDES",
        help="plan_memory.py overrides in one string (repeatable; default: the Phi-1.5 plan)",
    )
    args = parser.parse_args(argv)
    started = time.perf_counter()
    plans = []
    for overrides in args.plan or [" ".join(CASES["phi"])]:
        print(f"python scripts/plan_memory.py {overrides}")
        rows = run(overrides.split())
        for row in rows:
            print(f"  {row['phase']:5} {row['setup']:50} {_verdict(row)}")
        plans.append(
            {
                "command": f"python scripts/plan_memory.py {overrides}",
                "summary": summary(rows),
                "measurements": rows,
            }
        )
        print(f"  {plans[-1]['summary']}")
    result = {"short_counts": list(SHORT_COUNTS), "plans": plans}
    if not args.no_write:
        print(write_result("layer_extrapolation", result, started=started))
    return 0


if __name__ == "__main__":
    sys.exit(main())
