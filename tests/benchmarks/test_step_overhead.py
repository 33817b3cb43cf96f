"""The per-step overhead benchmark: its step times, its summary line, and a tiny real run."""

from __future__ import annotations

import pytest

from benchmarks import configs, run_all, step_overhead


def test_step_times_leave_the_warm_up_out():
    warm_up = [0.1 * i for i in range(step_overhead.WARMUP_STEPS)]  # 100 ms steps
    start = warm_up[-1] + 0.1
    marks = [*warm_up, start, start + 0.002, start + 0.005]  # then 2 ms and 3 ms
    assert step_overhead.step_intervals_us(marks) == pytest.approx([2000.0, 3000.0])
    assert step_overhead.per_step_us(marks) == pytest.approx(2500.0)
    with pytest.raises(ValueError, match="warm-up"):
        step_overhead.per_step_us(warm_up)


@pytest.mark.parametrize("on_parity", [0, 1])
def test_alternating_blocks_are_paired_on_then_off(on_parity):
    block = step_overhead.LOG_EVERY_N_STEPS
    # 1 ms steps; the blocks of parity on_parity cost 0.1 ms more per step, and one step of
    # every block (the logging step) 5 ms more, which pairing single steps would put on one side
    times, mark = [], 0.0
    for step in range(step_overhead.WARMUP_STEPS + 6 * block + 1):
        times.append(mark)
        extra = 1e-4 if step // block % 2 == on_parity else 0.0
        mark += 1e-3 + extra + (5e-3 if step % block == block - 1 else 0.0)
    difference = step_overhead.alternate_steps_difference_us(times, on_parity, block=block)
    assert difference == pytest.approx(100.0)
    single = step_overhead.alternate_steps_difference_us(times, on_parity)
    assert single != pytest.approx(100.0)
    with pytest.raises(ValueError, match="no pair"):
        step_overhead.alternate_steps_difference_us(
            times[: step_overhead.WARMUP_STEPS + block], 0, block=block
        )


def test_summary_line_shows_both_targets():
    results = {
        "vramkit_minus_lightning_us": 140.0,
        "guard_us_per_param_tensor": 0.02,
        "target_vramkit_minus_lightning_us": 100.0,
        "target_guard_us_per_param_tensor": 0.1,
        "targets_met": False,
    }
    value, target, met = run_all._headline("step_overhead", results)
    assert "+140.0 us/step" in value and "0.02 us per parameter tensor" in value
    assert target == "<= 100 us / 0.1 us" and not met


@pytest.mark.slow
def test_a_tiny_run_measures_every_side_and_checks_the_targets(monkeypatch, shared_data_dir):
    # The default callbacks come from the composed default task, whose data `make bench` keeps
    # in the repository's data/; a test keeps it under pytest's tmp paths (forked sides too).
    monkeypatch.setattr(configs, "DATA_DIR", shared_data_dir)
    # No warm-up in this process (the pair's processes keep theirs): 3 blocks of steps give
    # the in-fit measure a block pair whichever parity a round starts with.
    monkeypatch.setattr(step_overhead, "WARMUP_STEPS", 0)
    steps = step_overhead.WARMUP_STEPS + 3 * step_overhead.LOG_EVERY_N_STEPS + 2
    numbers = step_overhead.run(rounds=1, steps=steps)
    assert set(numbers["step_us"]) == {"plain", "lightning", "vramkit"}
    assert all(numbers["step_us"][side]["min"] > 0 for side in numbers["step_us"])
    assert set(numbers["guard_us"]) == {"4", "100", "600"}
    assert all(len(values) == 1 for values in numbers["all_rounds"].values())
    bytecodes = numbers["bytecodes_per_step"]
    assert bytecodes["lightning"] > 1000  # a Lightning step runs thousands of bytecodes
    difference = bytecodes["vramkit"] - bytecodes["lightning"]
    assert numbers["vramkit_minus_lightning_bytecodes"] == difference
    # the no-op profiler measured on both sides: Lightning's costs hundreds of bytecodes a step
    quiet = numbers["lightning_quiet_profiler_bytecodes"]
    assert numbers["noop_profiler_bytecodes_saved"] == bytecodes["lightning"] - quiet > 500
    assert numbers["vramkit_own_bytecodes"] == bytecodes["vramkit"] - quiet
    met = (
        numbers["vramkit_minus_lightning_us"] <= numbers["target_vramkit_minus_lightning_us"]
        and numbers["guard_us_per_param_tensor"] <= numbers["target_guard_us_per_param_tensor"]
    )
    assert numbers["targets_met"] is met
