"""`decide_run_memory`, the planner's one entry for a run: which decisions each mode takes, in
which order their lines come, and that a refusal stops the run while an untraceable model only
says so. The steps are stand-ins here (each is tested on its own beside this file)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from vramkit.core.hardware.profile import HardwareProfile, ProfileSource
from vramkit.core.planner.decisions import run_memory
from vramkit.core.planner.decisions.auto_batch import AutoBatchSizes
from vramkit.core.planner.decisions.host_memory import HostBudget, LoaderSettings
from vramkit.core.planner.decisions.run_memory import RunMemoryRequest, decide_run_memory
from vramkit.core.planner.errors import DoesNotFitError, PlanningError
from vramkit.core.planner.request import PlanRequest
from vramkit.core.planner.tracing.run_setup import RunSetup
from vramkit.core.units import GIB

T4 = HardwareProfile(
    name="t4", accelerator="gpu", precision="16-mixed", memory_gib=14.6, compute_capability="7.5"
)
CPU = HardwareProfile(name="cpu", accelerator="cpu", precision="32-true", memory_gib=8.0)
SOURCE = ProfileSource("conf/hw/t4.yaml", ())


def request(mode: str, profile=T4, sizes=(None, None), **options) -> RunMemoryRequest:
    plan = PlanRequest(
        module=lambda overrides: None,
        data=lambda: None,
        profile=profile,
        setup=RunSetup.from_profile(profile),
        train_batch_size=sizes[0],
        val_batch_size=sizes[1],
        with_remedies=False,
    )
    return RunMemoryRequest(plan, mode, SOURCE, LoaderSettings(0), **options)


class Steps:
    """Stand-ins for the steps, recording the order they ran in."""

    def __init__(self, monkeypatch, *, fit=None, sizes=None, host=None):
        self.ran: list[str] = []
        plan = SimpleNamespace(name="the requested run's plan")
        self.fit = fit or SimpleNamespace(
            plan=plan, applied=False, lines=(), remedy=(), record=lambda: None
        )
        self.sizes = sizes or AutoBatchSizes(826, 100, 1, ("sizes searched",), {"train": {}})

        def within(plan_request, *, rehearsal, typed):
            self.ran.append(f"fit (rehearsal={rehearsal})")
            if isinstance(self.fit, Exception):
                raise self.fit
            return self.fit

        def auto(plan_request, planned):
            self.ran.append(f"sizes (planned={planned is plan})")
            return self.sizes

        def inference(plan_request, source):
            self.ran.append(f"inference at {plan_request.val_batch_size}")
            return 64, ("inference planned",)

        def gpu_host(planned, loader, *, train_batch_size, val_batch_size, typed):
            self.ran.append(f"host at {train_batch_size}/{val_batch_size}")
            return host or SimpleNamespace(line=lambda: "host checked")

        monkeypatch.setattr(run_memory, "plan_within_budget", within)
        monkeypatch.setattr(run_memory, "resolve_auto_batch_sizes", auto)
        monkeypatch.setattr(run_memory, "settle_inference_batch", inference)
        monkeypatch.setattr(run_memory, "check_gpu_host_memory", gpu_host)


def test_a_gpu_run_that_fits_is_sized_then_its_host_checked_at_those_sizes(monkeypatch):
    steps = Steps(monkeypatch)
    memory = decide_run_memory(request("device"))
    assert steps.ran == ["fit (rehearsal=False)", "sizes (planned=True)", "host at 826/100"]
    assert (memory.train_batch_size, memory.val_batch_size, memory.accumulate_grad_batches) == (
        826,
        100,
        1,
    )
    # the host line is said after the run settles its accumulation: apart from the others
    assert memory.lines == ("sizes searched",) and memory.host_lines == ("host checked",)
    assert memory.memory_plan == {"train": {}} and memory.remedy == ()


def test_a_remedy_stops_the_decisions_there(monkeypatch):
    fit = SimpleNamespace(
        plan=None,
        applied=True,
        lines=("table", "applies"),
        remedy=("++hw.batch_size=2",),
        record=lambda: {"applied": True},
    )
    steps = Steps(monkeypatch, fit=fit)
    memory = decide_run_memory(request("device"))
    assert steps.ran == ["fit (rehearsal=False)"]  # the remedied run is settled afresh
    assert memory.remedy == ("++hw.batch_size=2",) and memory.fit_record == {"applied": True}
    assert memory.train_batch_size is None and memory.host_lines == ()


def test_a_rehearsal_only_says_what_its_gpu_would_do(monkeypatch):
    steps = Steps(monkeypatch)
    memory = decide_run_memory(request("rehearsal"))
    assert steps.ran == ["fit (rehearsal=True)"]
    assert memory.train_batch_size is None and memory.memory_plan is None


def test_a_refusal_propagates_and_an_untraceable_model_is_a_line(monkeypatch):
    Steps(monkeypatch, fit=DoesNotFitError("does not fit, remedies: …"))
    with pytest.raises(DoesNotFitError):
        decide_run_memory(request("device"))

    steps = Steps(monkeypatch, fit=PlanningError("no sample"))
    memory = decide_run_memory(request("device"))
    # not traced: the sizes are searched without a plan, and the host is not checked
    assert steps.ran == ["fit (rehearsal=False)", "sizes (planned=False)"]
    assert memory.lines[0].startswith("memory planner unavailable (no sample)")


def test_evaluation_plans_its_batch_from_the_inference_phase_alone(monkeypatch):
    steps = Steps(monkeypatch)
    memory = decide_run_memory(request("device", training=False, inference=True))
    assert steps.ran == ["inference at None"]  # "auto": searched by the inference plan
    assert memory.val_batch_size == 64 and memory.train_batch_size is None
    assert memory.lines == ("inference planned",)


def test_a_remedied_run_is_sized_without_planning_its_fit_again(monkeypatch):
    steps = Steps(monkeypatch)
    memory = decide_run_memory(request("device", check_fit=False))
    assert steps.ran == ["sizes (planned=False)"]  # no plan to check the host with either
    assert memory.train_batch_size == 826 and memory.host_lines == ()


def test_a_cpu_run_is_sized_within_the_hosts_memory(monkeypatch):
    sized = []

    def host_sizing(plan_request, loader, budget, *, searched, typed):
        sized.append((plan_request.train_batch_size, searched))
        plans = [SimpleNamespace(batch_size=size) for size in (3, 16)]
        return SimpleNamespace(
            train=plans[0],
            val=plans[1],
            line=lambda: "host memory planned",
            predictions=lambda profile: {"profile": profile.name},
        )

    monkeypatch.setattr(run_memory, "size_for_host_memory", host_sizing)
    budget = HostBudget(8 * GIB, 0.85, "test")  # whatever this host has free
    monkeypatch.setattr(run_memory, "host_budget", lambda fraction, memory_gib: budget)
    memory = decide_run_memory(request("host", CPU, (16, 16), searched=(True, False)))
    assert sized == [(16, (True, False))]
    assert (memory.train_batch_size, memory.val_batch_size) == (3, 16)
    assert memory.lines == (
        "host memory planned",
        "batch_size 'auto' takes 3, the largest that fits the host's memory or the dataset's size "
        "(batch_size_defaults.train is 16)",
    )
    assert memory.memory_plan == {"profile": "cpu"}
