"""What the finiteness checks cost per training step when every number is finite.

:class:`~vramkit.core.callbacks.finite_guard.FiniteGuard` runs two hooks per step: the fused
gradient check before the optimizer step and the loss check after it. Here a plain PyTorch step
(zero_grad, forward, backward, AdamW step; CPU, one thread, batch 8) runs with and without those
two hooks, on a model of 4 parameter tensors (Linear-ReLU-Linear, 16 wide: the framework cost
made visible) and one of 100 (50 Linear layers, 64 wide). Guarded and plain steps alternate in
blocks of ``--block`` steps within one process, so a shared machine's drift hits both alike;
each round gives the median guarded step minus the median plain step, and the figure is the
median over rounds with its spread (min, max). The gradient check is also timed alone against
the alternative it replaced, one ``torch._foreach_norm`` over the gradients.

``python -m benchmarks.finite_guard [--rounds N] [--block N]`` writes
``results/finite_guard.json``.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from typing import Any

import torch
from torch import nn

from benchmarks.record import write_result
from vramkit.core.callbacks.finite_guard import FiniteGuard, all_finite

BATCH = 8


def _model(tensors: int) -> tuple[nn.Module, int]:
    if tensors == 4:
        return nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 1)), 16
    layers = [nn.Linear(64, 64) for _ in range(tensors // 2 - 1)]
    return nn.Sequential(*layers, nn.Linear(64, 1)), 64


def _round(tensors: int, block: int) -> dict[str, float]:
    model, width = _model(tensors)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    guard = FiniteGuard()
    x, y = torch.randn(BATCH, width), torch.randn(BATCH, 1)
    times: dict[bool, list[float]] = {False: [], True: []}
    for guarded in [False, True] * 4:
        for _ in range(block):
            start = time.perf_counter()
            optimizer.zero_grad(set_to_none=True)
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            if guarded:
                guard.on_before_optimizer_step(None, model, optimizer)
            optimizer.step()
            if guarded:
                guard.on_train_batch_end(None, model, loss, None, 0)
            times[guarded].append(time.perf_counter() - start)
    grads = [p.grad for p in model.parameters()]
    return {
        "plain_step_us": statistics.median(times[False]) * 1e6,
        "guard_us": (statistics.median(times[True]) - statistics.median(times[False])) * 1e6,
        "fused_check_us": _time(lambda: all_finite(grads)),
        "foreach_norm_check_us": _time(
            lambda: bool(torch.stack(torch._foreach_norm(grads, math.inf)).isfinite().all())
        ),
    }


def _time(check: Any, calls: int = 300) -> float:
    for _ in range(20):
        check()
    samples = []
    for _ in range(calls):
        start = time.perf_counter()
        check()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples) * 1e6


def _summary(values: list[float]) -> dict[str, float]:
    return {
        "median": round(statistics.median(values), 2),
        "min": round(min(values), 2),
        "max": round(max(values), 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--block", type=int, default=50, help="steps per guarded/plain block")
    args = parser.parse_args()
    started = time.perf_counter()
    torch.set_num_threads(1)
    numbers: dict[str, Any] = {"rounds": args.rounds, "block": args.block, "batch": BATCH}
    for tensors in (4, 100):
        rounds = [_round(tensors, args.block) for _ in range(args.rounds)]
        case = {key: _summary([r[key] for r in rounds]) for key in rounds[0]}
        case["guard_share_of_step"] = round(
            case["guard_us"]["median"] / case["plain_step_us"]["median"], 4
        )
        numbers[f"{tensors}_param_tensors"] = case
        print(tensors, "parameter tensors:", case)
    print("wrote", write_result("finite_guard", numbers, started=started))


if __name__ == "__main__":
    main()
