"""A Hydra callback that refuses a sweep's mistake once, before any job starts.

Inside a multirun a refusal is raised, so that one bad job is recorded as failed and the sweep goes
on. A mistake every job shares (``+hw=t4`` on a machine without that GPU, ``trainer.precision=64``)
would then be printed once per job, end in Hydra's traceback and leave a sweep folder. Here,
``on_multirun_start`` (after composition, before the sweeper creates the sweep folder) composes
the first job's config through Hydra's public ``compose`` and runs on it the checks ``train()``
runs before any work: `refuse_mistakes` and the hardware profile against this machine (without
planning memory, which each job does). A refusal prints its message alone and exits with status 2,
leaving no folder; the first job is the command line's sweeps at their first value (values that a
sweeper draws, such as Optuna's ``params``, are checked in each job as it starts).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from hydra import compose
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import ValueType
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf, open_dict

from vramkit.core.run.refusals import refusals_before_the_sweep
from vramkit.core.run.resolve_hardware import resolve_hardware
from vramkit.core.run.train import refuse_mistakes


class SweepPrecheck(Callback):
    """Hydra callback: check a multirun's first job before the sweep starts any job."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        overrides = OmegaConf.to_container(config.hydra.overrides.task, resolve=False)
        with refusals_before_the_sweep():
            check_first_job(kwargs.get("config_name"), first_job_overrides(overrides))


def first_job_overrides(overrides: Sequence[str]) -> list[str]:
    """The overrides of a sweep's first job: each sweep (``a=1,2``, ``range(…)``) at its first
    value; a sweep without a list of values (Optuna's ``interval(…)``, ``glob(…)``) is left out."""
    first = []
    for override in OverridesParser.create().parse_overrides(list(overrides)):
        if not override.is_sweep_override():
            first.append(override.input_line)
        elif override.value_type in _LISTED_SWEEPS:
            value = next(iter(override.sweep_string_iterator()))
            first.append(f"{override.get_key_element()}={value}")
    return first


_LISTED_SWEEPS = (ValueType.CHOICE_SWEEP, ValueType.SIMPLE_CHOICE_SWEEP, ValueType.RANGE_SWEEP)
"""Sweeps whose values the command line lists (a glob needs the config loader; an interval is
sampled by the sweeper)."""


def check_first_job(config_name: str | None, overrides: list[str]) -> None:
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
            resolve_hardware(cfg, conf_dir=Path(cfg.paths.conf_dir), plan_batches=False)
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
