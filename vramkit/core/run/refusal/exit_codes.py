"""Known refusals end a run with their message alone, not a traceback.

A user's mistake (a bad value, a misspelt key, a profile this machine cannot run) is caught before
any work with a message that says what to do; the traceback under it only hides that message.
`HYDRA_FULL_ERROR=1` shows it again; in a multirun the error is raised, so the sweep records the
job as failed and goes on. A single run's refusal made before any work also removes what the run
wrote into its folder (`withdraw_claim`), so it leaves no run folder.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode

from vramkit.core.callbacks.bad_input_report import NoUsableInputError
from vramkit.core.callbacks.finite_guard import TrainingDiverged
from vramkit.core.config.schema import ConfigError
from vramkit.core.hardware.device_check import HardwareMismatchError
from vramkit.core.io.disk_space import DiskFullError
from vramkit.core.planner.errors import DoesNotFitError
from vramkit.core.run.folder.run_folder_claim import withdraw_claim
from vramkit.core.run.refusal.held_stderr import release_stderr

REFUSALS = (ConfigError, HardwareMismatchError, DoesNotFitError, DiskFullError, NoUsableInputError)
"""Errors whose message is the whole story (a full disk names its folder, free and needed bytes)."""
EXIT_REFUSED = 2
"""The exit status of a refused run (as argparse uses for usage errors)."""
EXIT_DIVERGED = 3
"""The exit status of a run stopped on a non-finite loss, gradient or weight (its message names
the step and the last finite checkpoint)."""


@contextlib.contextmanager
def refusals_as_messages() -> Iterator[None]:
    """Inside a single Hydra run, turn a known refusal into its message and exit status 2 (a
    diverged run: 3)."""
    release_stderr()  # the run has started: Hydra composed the command line without a refusal
    try:
        yield
    except (*REFUSALS, TrainingDiverged) as error:
        multirun = HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN
        # A sweep's job keeps its folder (its job_result.json records the error), and so does a
        # run that trained: a diverged run's log and checkpoints are what its user reads next.
        if not multirun and not isinstance(error, TrainingDiverged):
            withdraw_claim()  # no run folder for a refusal made before any work
        if multirun or os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        print(f"error: {error}", file=sys.stderr)
        sys.exit(EXIT_DIVERGED if isinstance(error, TrainingDiverged) else EXIT_REFUSED)


@contextlib.contextmanager
def refusals_before_the_sweep() -> Iterator[None]:
    """Around a check of what every job of a sweep shares, before any job starts: a known refusal
    ends the sweep with its message alone and exit status 2 (not once per job)."""
    release_stderr()  # the sweep has started: Hydra composed its command line without a refusal
    try:
        yield
    except REFUSALS as error:
        if os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        print(f"error: {error}", file=sys.stderr)
        sys.exit(EXIT_REFUSED)
