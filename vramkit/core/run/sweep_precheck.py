"""A Hydra callback that refuses a sweep's mistake once, before any job starts.

Inside a multirun a refusal is raised, so that one bad job is recorded as failed and the sweep goes
on. A mistake every job shares (``+hw=t4`` on a machine without that GPU, ``trainer.precision=64``)
would then be printed once per job, end in Hydra's traceback and leave a sweep folder. Here,
``on_multirun_start`` (after composition, before the sweep folder is claimed) composes job configs
through Hydra's public ``compose`` and runs on each the checks ``train()`` runs before any work:
`refuse_mistakes` and the hardware profile against this machine (without planning memory, which
each job does). A refusal prints its message alone and exits with status 2, leaving no folder.

The jobs checked (`jobs_to_check`, about 0.5 s each): the first job (every sweep of the command
line at its first value), then each further value of each swept key with the others at their
first value (the last value of a ``range(…)``), so a bad value anywhere in a list is found
without composing the whole grid. Values that a sweeper draws (Optuna's ``params``) are checked
in each job as it starts.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Sequence
from typing import Any

from hydra import compose
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import ValueType
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf, open_dict

from vramkit.core.run.refusal.exit_codes import refusals_before_the_sweep
from vramkit.core.run.resume_contract import check_resume
from vramkit.core.run.settling.settle import settle
from vramkit.core.run.train import refuse_mistakes


class SweepPrecheck(Callback):
    """Hydra callback: check a multirun's jobs before the sweep starts any of them."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        overrides = OmegaConf.to_container(config.hydra.overrides.task, resolve=False)
        with refusals_before_the_sweep():
            for job in jobs_to_check(overrides):
                check_job(kwargs.get("config_name"), job)


def jobs_to_check(overrides: Sequence[str]) -> list[list[str]]:
    """The override lists of the jobs to check: the first job, then one job per further value of
    each listed sweep (``a=1,2``; ``range(…)``: its last value) with the other sweeps at their first
    value. A sweep without a list of values (Optuna's ``interval(…)``, ``glob(…)``) is left out."""
    # In the command line's order: an override, or a swept key with the values to check.
    parts: list[str | tuple[str, list[str]]] = []
    for override in OverridesParser.create().parse_overrides(list(overrides)):
        if not override.is_sweep_override():
            parts.append(override.input_line)
        elif override.value_type in _LISTED_SWEEPS:
            values = list(override.sweep_string_iterator())
            if override.value_type == ValueType.RANGE_SWEEP:
                values = list(dict.fromkeys([values[0], values[-1]]))
            parts.append((override.get_key_element(), values))

    def job(varied: int = -1, value: str = "") -> list[str]:
        return [
            part if isinstance(part, str) else f"{part[0]}={value if i == varied else part[1][0]}"
            for i, part in enumerate(parts)
        ]

    jobs = [job()]
    for index, part in enumerate(parts):
        if not isinstance(part, str):
            jobs.extend(job(index, value) for value in part[1][1:])
    return jobs


_LISTED_SWEEPS = (ValueType.CHOICE_SWEEP, ValueType.SIMPLE_CHOICE_SWEEP, ValueType.RANGE_SWEEP)
"""Sweeps whose values the command line lists (a glob needs the config loader; an interval is
sampled by the sweeper)."""


def check_job(config_name: str | None, overrides: list[str]) -> None:
    """Compose ``config_name`` with ``overrides`` as a job of this app and raise the refusal
    ``train()`` would raise before any work (`REFUSALS`); say nothing otherwise."""
    before = HydraConfig.instance().cfg
    try:
        cfg = compose(config_name, overrides=overrides, return_hydra_config=True)
        HydraConfig.instance().set_config(cfg)  # messages name files and overrides through it
        with open_dict(cfg):
            del cfg.hydra
        with _quiet():
            refuse_mistakes(cfg)
            check_resume(cfg)  # a checkpoint every job would fail to load
            settle(cfg, plan_batches=False, user_overrides=overrides, config_name=config_name)
    finally:
        HydraConfig.instance().cfg = before


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    # The first job prints the same lines (detected profile, batch sizes) when it runs.
    logging.disable(logging.INFO)
    try:
        yield
    finally:
        logging.disable(logging.NOTSET)
