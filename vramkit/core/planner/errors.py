"""Why a plan could not be made."""

from __future__ import annotations


class PlanningError(RuntimeError):
    """The task cannot be planned as configured; the message says what and why."""


class PlanningDataError(PlanningError):
    """The datamodule cannot give the planner a sample batch; the message says which split."""


class DoesNotFitError(PlanningError):
    """Not even the smallest batch fits the profile's budget; the message says what to run."""
