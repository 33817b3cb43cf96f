"""A run's memory decisions, from its composed config: the one place settling calls the planner.

`vramkit.core.run.settling.resolve_hardware.settle_profile` calls `plan_memory` once the profile
is checked against the device (once more only to settle the remedy an automatic fit chose).
`plan_memory` reads what the planner needs from the config (the `PlanRequest`, the loader
settings, the task's stated batch sizes) and makes one call into the planner,
`vramkit.core.planner.decisions.run_memory.decide_run_memory`, whose answer, a `RunMemory`, holds
every decision, the lines that say why and the run folder's records. Nothing here prints or
writes while deciding: the run does, once it has decided (`vramkit.core.run.train`, which writes
`fit_decision.json` with `write_fit_decision`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from vramkit.core.config.settings_schemas import with_class_defaults
from vramkit.core.hardware.profile import HardwareProfile, ProfileSource
from vramkit.core.io.checkpoint_io import atomic_write_bytes
from vramkit.core.planner.decisions.host_memory import DEFAULT_PREFETCH_FACTOR, LoaderSettings
from vramkit.core.planner.decisions.run_memory import (
    Mode,
    RunMemory,
    RunMemoryRequest,
    decide_run_memory,
)
from vramkit.core.planner.request import (
    BATCH_SIZE_KEYS,
    batch_size_request,
    task_batch_defaults,
)
from vramkit.core.run.settling.plan_request_from_config import plan_request

FIT_DECISION = "fit_decision.json"
"""What the automatic fit decided, written into the run folder when the plan did not fit."""


def plan_memory(
    cfg: DictConfig,
    profile: HardwareProfile,
    *,
    mode: Mode,
    source: ProfileSource,
    training: bool = True,
    check_fit: bool = True,
    inference: bool = False,
    typed: Callable[[str], str] = str,
) -> RunMemory:
    """Decide the memory of `cfg`'s run on `profile` (the GPU profile it is planned for, or a
    `cpu` run's own) in one call into the planner; see `RunMemoryRequest` for the options.

    A `cpu` run's "auto" sizes are fitted up to the task's stated defaults: a `ProfileError`
    names the key and its file when the task states none. Raises what `decide_run_memory` raises.
    """
    asked = batch_size_request(profile)
    sizes = None
    if mode == "host":
        defaults = task_batch_defaults(cfg)
        sizes = tuple(
            defaults.for_auto(field, source) if size is None else size
            for (field, _), size in zip(BATCH_SIZE_KEYS, asked.sizes, strict=True)
        )
    request = RunMemoryRequest(
        plan=plan_request(cfg, profile, batch_sizes=sizes, with_remedies=False),
        mode=mode,
        source=source,
        loader=loader_settings(cfg, profile),
        searched=asked.searched,
        training=training,
        check_fit=check_fit,
        inference=inference,
        typed=typed,
    )
    return decide_run_memory(request)


def write_fit_decision(output_dir: Path, record: dict[str, Any]) -> Path:
    """Write `record` as `output_dir/fit_decision.json`; return the path."""
    path = Path(output_dir) / FIT_DECISION
    atomic_write_bytes(path, (json.dumps(record, indent=2) + "\n").encode())
    return path


def loader_settings(cfg: DictConfig, profile: HardwareProfile) -> LoaderSettings:
    """The run's loader settings: the data config's own values (a class default as its value:
    `with_class_defaults`), else the profile's."""
    data = cfg.get("data")
    plain = OmegaConf.to_container(data, resolve=False) if isinstance(data, DictConfig) else {}
    raw = with_class_defaults(plain)
    workers = raw.get("num_workers")
    pin = raw.get("pin_memory")
    prefetch = raw.get("prefetch_factor")
    persistent = raw.get("persistent_workers")
    return LoaderSettings(
        num_workers=workers if isinstance(workers, int) else profile.num_workers,
        prefetch_factor=prefetch if isinstance(prefetch, int) else DEFAULT_PREFETCH_FACTOR,
        pin_memory=pin if isinstance(pin, bool) else profile.pin_memory,
        persistent_workers=persistent if isinstance(persistent, bool) else True,
    )
