"""A run's host memory (`host_sizing`): a `cpu` run's "auto" batch sizes fit the host, a size that
cannot fit is refused with the remedies, and a GPU run's pinned batches, workers and offloaded
optimizer state are checked against the host.

Tested on stand-in planners (a step of 1 GiB per sample; a parameter count): fast and exact. The
run's side (a composed config, the tiny classifier traced and run) is in
tests/core/run/settling/test_host_fit.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import pytest
import torch

from vramkit.core.hardware.profile import HardwareProfile
from vramkit.core.planner.decisions import host_sizing
from vramkit.core.planner.decisions.host_memory import (
    CPU_STEP_ALLOWANCE,
    HostBudget,
    LoaderSettings,
)
from vramkit.core.planner.decisions.host_sizing import size_for_host_memory
from vramkit.core.planner.errors import DoesNotFitError
from vramkit.core.planner.tracing.batches import PhaseSamples
from vramkit.core.planner.tracing.run_setup import RunSetup
from vramkit.core.planner.tracing.sharding import sharding_of
from vramkit.core.units import GIB

CPU = HardwareProfile(name="cpu", accelerator="cpu", precision="32-true", num_workers=0)
BASELINE = GIB // 2


@dataclass
class _StepPerSample:
    """The stand-in planner: a phase's traced peak is 1 GiB per sample (CPU_STEP_ALLOWANCE
    divided out, so the host plan's step is exactly that)."""

    samples: PhaseSamples
    traces: int = 0

    def measure(self, phase: str, batch_size: int, setup: RunSetup) -> SimpleNamespace:
        self.traces += 1
        return SimpleNamespace(peak=int(batch_size * GIB / CPU_STEP_ALLOWANCE), allocated={})


@pytest.fixture
def per_sample(monkeypatch):
    sample = {"x": torch.zeros(1, 4)}
    planner = _StepPerSample(PhaseSamples(sample, sample, train_size=100, val_size=100))

    def plan_task(request):
        return SimpleNamespace(
            planner=planner, setup=RunSetup("32-true", None), train_limit=100, val_limit=100
        )

    monkeypatch.setattr(host_sizing, "plan_task", plan_task)
    monkeypatch.setattr(host_sizing, "process_baseline", lambda: BASELINE)


def _fit(train: int, val: int, *, searched=(False, False), available_gib=4.0):
    budget = HostBudget(int(available_gib * GIB), 1.0, "test")
    request = SimpleNamespace(profile=CPU, train_batch_size=train, val_batch_size=val)
    return size_for_host_memory(request, LoaderSettings(0), budget, searched=searched)


def test_auto_takes_the_largest_size_up_to_the_default_that_fits(per_sample):
    # 0.5 GiB baseline + 1 GiB per sample within 4 GiB: 3 samples fit, 4 do not
    fit = _fit(16, 2, searched=(True, True))
    assert (fit.train.batch_size, fit.val.batch_size) == (3, 2)  # val's default 2 fits
    assert fit.train.total <= 4 * GIB
    assert "host memory planned" in fit.line() and "at batch 3" in fit.line()


def test_auto_keeps_the_default_when_it_fits(per_sample):
    fit = _fit(2, 1, searched=(True, True))
    assert (fit.train.batch_size, fit.val.batch_size) == (2, 1)


def test_a_set_size_that_cannot_fit_is_refused_with_the_size_that_does(per_sample):
    with pytest.raises(DoesNotFitError) as refused:
        _fit(8, 1)
    message = str(refused.value)
    assert "\n" not in message
    assert "train needs 8.50 GiB" in message
    assert "hw.batch_size=3 (3.50 GiB)" in message


def test_when_one_sample_cannot_fit_the_remedy_says_so(per_sample):
    with pytest.raises(DoesNotFitError, match="at batch size 1 it still needs more"):
        _fit(1, 1, searched=(True, True), available_gib=1.0)


@dataclass
class _Parameters:
    """A GPU plan's planner as the host check reads it: samples, a parameter count and the
    paged optimizer state (none)."""

    count: int
    samples: PhaseSamples

    def parameter_count(self, setup) -> int:
        return self.count

    def paged_optimizer_bytes(self, setup) -> int:
        return 0  # no paged bitsandbytes optimizer in these runs


ZERO2_OFFLOAD = {
    "strategy": {
        "_target_": "lightning.pytorch.strategies.DeepSpeedStrategy",
        "stage": 2,
        "offload_optimizer": True,
    }
}
T4 = HardwareProfile(
    name="t4", accelerator="gpu", precision="16-mixed", memory_gib=14.6, compute_capability="7.5"
)


def _gpu_check(monkeypatch, parameters: int, trainer: dict):
    monkeypatch.setattr(host_sizing, "process_baseline", lambda: BASELINE)
    monkeypatch.setattr(
        host_sizing, "host_budget", lambda fraction: HostBudget(8 * GIB, 1.0, "test")
    )
    sample = {"x": torch.zeros(1, 3, 256, 256)}  # 0.75 MiB a sample
    plan = SimpleNamespace(
        planner=_Parameters(parameters, PhaseSamples(sample, sample, 100, 100)),
        setup=SimpleNamespace(device="a GPU", sharding=sharding_of(trainer, T4.world_size)),
        profile=T4,
    )
    loader = LoaderSettings(num_workers=2, pin_memory=True)
    return host_sizing.check_gpu_host_memory(plan, loader, train_batch_size=100, val_batch_size=100)


def test_a_gpu_runs_offloaded_optimizer_state_is_checked_against_the_host(monkeypatch):
    # ZeRO-2 offload of 100 M parameters: 100 M × 16 × 1.5 = 2.4 GB on the host
    fit = _gpu_check(monkeypatch, 10**8, ZERO2_OFFLOAD)
    assert fit.train.offloaded == 24 * 10**8 and fit.train.step == 0
    # 2 workers × 2 prefetched batches of 75 MiB, pinned in 128-MiB blocks
    assert fit.train.pinned == 4 * 128 * 2**20
    with pytest.raises(DoesNotFitError) as refused:
        _gpu_check(monkeypatch, 10**9, ZERO2_OFFLOAD)  # 24 GB offloaded, 8 GiB of host
    message = str(refused.value)
    assert "trainer=deepspeed_zero2 (saves 22.35 GiB" in message
    assert "hw.pin_memory=false (saves 0.50 GiB)" in message and "\n" not in message
    assert _gpu_check(monkeypatch, 10**9, {}).train.offloaded == 0  # no offload: fits
