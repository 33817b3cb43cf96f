"""Compose the project's Hydra configs for a benchmark, as ``python train.py ...`` would."""

from __future__ import annotations

import dataclasses
import logging
import os
from pathlib import Path

from omegaconf import DictConfig

from benchmarks.record import REPO_ROOT
from vramkit.core.run.library_chatter import OutputSettings, hide_library_chatter
from vramkit.core.run.settling.compose import compose_config, settled_config
from vramkit.core.run.settling.settle import Settlement, settle

# Benchmark data lives with the project's generated data, so it is rendered once per checkout.
DATA_DIR = REPO_ROOT / "data"


_SETTLED: dict[tuple[str, ...], Settlement] = {}
"""Settlements by the overrides and data folder they were made for (`compose_run_config`)."""


def compose_run_config(*overrides: str, output_dir: Path, resolve: bool = True) -> DictConfig:
    """``conf/train.yaml`` with ``overrides`` and output in ``output_dir``, as ``train.py`` has it.

    With ``resolve`` the config is settled and composed again (what ``train()`` does first: the
    run's config, batch sizes explicit); leave that to ``train()`` when the config goes there.
    Generated data goes to the repository's ``data/`` folder unless an override moves it.

    A benchmark composes the same run for many output folders (each side, each round): the
    first settlement of ``overrides`` is kept for the process and its forks, and later calls
    only move its folders. Settling plans the batch sizes (model traces, seconds of CPU each
    time), and where the folder is all that differs every side then runs the same batches.
    """
    os.environ.setdefault("WANDB_SILENT", "true")
    user = _user_overrides(overrides, output_dir)
    cfg = compose_config("train", user[1:], output_dir=Path(output_dir))
    if not resolve:
        return cfg
    key = (str(DATA_DIR), *overrides)
    kept = _SETTLED.get(key)
    if kept is None:
        kept = settle(cfg)
        if kept.user_overrides != user:
            return settled_config(kept)  # not a composition this cache can move: settled alone
        _SETTLED[key] = kept
    return settled_config(dataclasses.replace(kept, user_overrides=user))


def _user_overrides(overrides: tuple[str, ...], output_dir: Path) -> tuple[str, ...]:
    """The command line of a run in ``output_dir``, as `compose_config` gives it to Hydra."""
    return (
        f"paths.output_dir={Path(output_dir)}",
        f"paths.data_dir={DATA_DIR}",
        f"paths.log_dir={Path(output_dir) / 'logs'}",
        *overrides,
    )


def quiet_libraries() -> None:
    """Keep Lightning's and Hydra's start-up chatter, and what a run hides
    (`hide_library_chatter`), out of the benchmark output."""
    for name in ("lightning", "lightning.pytorch", "lightning.fabric", "vramkit"):
        logging.getLogger(name).setLevel(logging.WARNING)
    hide_library_chatter(OutputSettings())
