"""A `cpu` run's budget is the host's memory: "auto" batch sizes fit it, a size that cannot fit
is refused before any work with the remedies, and the plan is close to the RSS a run measures.

The decisions are tested on a stand-in planner whose step takes 1 GiB per sample (fast, exact);
the end-to-end tests trace and run the tiny text classifier.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from omegaconf import OmegaConf

from vramkit.core.hardware.profile import HardwareProfile, ProfileError
from vramkit.core.planner.decisions.host_memory import CPU_STEP_ALLOWANCE, HostBudget
from vramkit.core.planner.errors import DoesNotFitError
from vramkit.core.planner.tracing.batches import PhaseSamples
from vramkit.core.planner.tracing.run_setup import RunSetup
from vramkit.core.report.build import MEMORY_PLAN
from vramkit.core.run.settling import fit_to_budget as fit_module
from vramkit.core.run.settling.fit_to_budget import size_for_host_memory
from vramkit.core.run.train import train
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

    monkeypatch.setattr(fit_module, "plan_request", lambda cfg, profile, **_: None)
    monkeypatch.setattr(fit_module, "plan_task", plan_task)
    monkeypatch.setattr(fit_module, "process_baseline", lambda: BASELINE)


def _fit(train: int, val: int, *, searched=(False, False), available_gib=4.0):
    budget = HostBudget(int(available_gib * GIB), 1.0, "test")
    cfg = OmegaConf.create({"data": {"num_workers": 0}})
    return size_for_host_memory(
        cfg, CPU, budget, train_batch_size=train, val_batch_size=val, searched=searched
    )


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


TINY_TEXT = (
    "task=text_classification",
    "+hw=cpu",
    "hw.num_workers=0",
    "trainer.max_epochs=1",
    "logger=csv",
    "callbacks=default",
)


def test_a_cpu_run_over_the_hosts_memory_is_refused_before_any_work(compose_config):
    cfg = compose_config(*TINY_TEXT, "hw.batch_size=4", "hw.val_batch_size=4", "hw.memory_gib=0.2")
    with pytest.raises(DoesNotFitError) as refused:
        train(cfg)
    message = str(refused.value)
    assert "does not fit this host's memory" in message and "hw.memory_gib 0.2 GiB" in message
    assert "Remedies:" in message and "\n" not in message
    assert not Path(cfg.paths.output_dir).exists()  # refused before the run folder


def test_a_cpu_budget_above_the_hosts_memory_is_refused_before_any_work(compose_config):
    cfg = compose_config(*TINY_TEXT, "hw.memory_gib=5000")
    with pytest.raises(ProfileError, match=r"^hw\.memory_gib=5000 .* is more than this host's"):
        train(cfg)
    assert not Path(cfg.paths.output_dir).exists()


def test_the_planned_host_memory_is_close_to_the_measured_rss(compose_config):
    """The tiny classifier at batch 64 of 256 tokens: a step of about 0.3 GiB on the host."""
    cfg = compose_config(
        *TINY_TEXT,
        "hw.batch_size=64",
        "hw.val_batch_size=64",
        "data.max_length=256",
        "model.hf_config.max_position_embeddings=256",
    )
    train(cfg)
    run = Path(cfg.paths.output_dir)
    planned = json.loads((run / MEMORY_PLAN).read_text())
    (metrics,) = run.glob("**/metrics.csv")
    with metrics.open() as handle:
        rows = list(csv.DictReader(handle))
    for phase in ("train", "val"):
        measured = max(
            float(r[f"mem/{phase}_peak_gib"]) for r in rows if r[f"mem/{phase}_peak_gib"]
        )
        predicted = planned[phase]["peak_gib"]
        # stated tolerance: the plan is within -10% / +25% of the measured peak RSS
        assert 0.9 * measured <= predicted <= 1.25 * measured, (phase, predicted, measured)


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
    monkeypatch.setattr(fit_module, "process_baseline", lambda: BASELINE)
    monkeypatch.setattr(
        fit_module, "host_budget", lambda fraction: HostBudget(8 * GIB, 1.0, "test")
    )
    sample = {"x": torch.zeros(1, 3, 256, 256)}  # 0.75 MiB a sample
    plan = SimpleNamespace(
        planner=_Parameters(parameters, PhaseSamples(sample, sample, 100, 100)),
        setup=SimpleNamespace(device="a GPU"),
    )
    cfg = OmegaConf.create({"trainer": trainer, "data": {"num_workers": 2, "pin_memory": True}})
    return fit_module.check_gpu_host_memory(cfg, T4, plan, train_batch_size=100, val_batch_size=100)


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
