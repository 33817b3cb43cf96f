"""Where no profiler is asked for, a run's no-op profiler costs two empty calls per profiled
hook instead of a generator's set-up; a profiler the user asked for stays."""

from __future__ import annotations

from collections.abc import Callable

import lightning as L
import pytest
from lightning.pytorch.profilers import PassThroughProfiler, SimpleProfiler

from tests.bytecode_count import bytecodes
from vramkit.core.trainer_assembly.quiet_profiler import (
    QuietPassThroughProfiler,
    quiet_idle_profiler,
)
from vramkit.core.trainer_assembly.working_set import keep_working_callbacks


def _profiled_call(profiler: PassThroughProfiler) -> Callable[[], None]:
    def call() -> None:
        with profiler.profile("[Callback]Group.on_train_batch_end"):
            pass

    return call


def test_a_profiled_call_costs_a_fraction_of_the_default_profilersbytecodes() -> None:
    default, quiet = PassThroughProfiler(), QuietPassThroughProfiler()
    default_cost = bytecodes(_profiled_call(default))
    quiet_cost = bytecodes(_profiled_call(quiet))
    assert quiet_cost * 4 < default_cost, (quiet_cost, default_cost)


def test_the_quiet_context_lets_errors_through_and_can_be_nested() -> None:
    profiler = QuietPassThroughProfiler()
    with (
        pytest.raises(ValueError, match="inside"),
        profiler.profile("outer"),
        profiler.profile("inner"),
    ):
        raise ValueError("inside")
    with profiler.profile("again"):  # the shared context is reusable after an error
        pass


def test_keep_working_callbacks_quiets_only_lightnings_default_profiler(tmp_path) -> None:
    default = L.Trainer(accelerator="cpu", logger=False, default_root_dir=tmp_path)
    keep_working_callbacks(default)
    assert type(default.profiler) is QuietPassThroughProfiler
    assert isinstance(default.profiler, PassThroughProfiler)  # Lightning's checks still hold
    asked = L.Trainer(
        accelerator="cpu", logger=False, default_root_dir=tmp_path, profiler=SimpleProfiler()
    )
    assert not quiet_idle_profiler(asked)
    assert type(asked.profiler) is SimpleProfiler
