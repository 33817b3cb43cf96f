"""Settle, then compose: the two passes of every run.

1. Hydra composes the config the user asked for; no value of it plans anything (the trainer and
   data configs read the profile as plain ``${hw.…}`` interpolations, ``auto`` included).
2. ``settle(cfg)`` decides what the profile leaves open (detection, device check, the automatic
   fit, ``auto`` batch sizes, accumulation) and returns a ``Settlement``: a frozen, printable
   record whose ``overrides``, appended to the user's, say all of it (``hw.batch_size=826``,
   ``+hw=t4`` for a detected profile, a remedy's ``trainer=…``). A change made to the composed
   config in code before settling (the resume contract sets a resumed run's optimizer back to
   the checkpoint's and records ``resume.changes``) becomes overrides too (``++key=value``).
3. ``settled_config(settlement)`` composes the run's config once more, through Hydra's public
   compose API, from ``settlement.run_overrides``: what ``python train.py <run_overrides>``
   composes, the run folder's ``overrides.txt``.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig, OmegaConf

from vramkit.core.config.source import command_line_overrides, override_key
from vramkit.core.hardware.detect import DeviceInfo, probe_device
from vramkit.core.hardware.profile import HardwareProfile, describe_profile
from vramkit.core.run import resolve_hardware as hardware
from vramkit.core.run.compose import compose_run
from vramkit.core.run.run_folder import RUN_OVERRIDES


@dataclasses.dataclass(frozen=True)
class Settlement:
    """What settling a run decided, and the overrides that make the user's config the run's."""

    profile: HardwareProfile
    """The run's profile: name, precision, workers, compile, batch sizes and accumulation."""
    device: str
    """The device it was settled for ("NVIDIA T4 …", "CPU …"), or its own hardware (a preview)."""
    detected: bool
    """No `+hw=` was given: the machine chose the profile."""
    remedy: tuple[str, ...]
    """The automatic fit's overrides (`hw.fit: auto`), () when the requested run fit."""
    fit_records: tuple[dict[str, Any], ...]
    """What the automatic fit decided and why (the run folder's `fit_decision.json`)."""
    decisions: tuple[str, ...]
    """Each decision as it was logged (`hw: …` lines): detection, mapping, fit, batch sizes."""
    user_overrides: tuple[str, ...]
    """The overrides the user gave (the command line)."""
    in_code: tuple[str, ...]
    """Changes made to the composed config in code before settling (the resume contract's), as
    overrides: `++key=value`, `~key` for a key removed."""
    overrides: tuple[str, ...]
    """The settlement's own overrides, appended to the user's to compose the run's config."""
    config_name: str
    """The primary config composed ("train", "eval")."""
    conf_dir: str
    """The config tree it was composed from."""
    loader_workers: int | None = None
    """The worker processes the run's loaders get (``data.num_workers``, the profile's
    ``num_workers`` unless set otherwise); None when the config does not say."""

    @property
    def run_overrides(self) -> tuple[str, ...]:
        """The user's overrides, the changes made in code, and then the settlement's: the run's
        whole command line."""
        return (*self.user_overrides, *self.in_code, *self.overrides)

    def __str__(self) -> str:
        """The profile as the console shows it, what chose it, the remedy (when the automatic fit
        applied one) and the overrides (the decisions are logged as they are taken)."""
        how = "detected" if self.detected else "given"
        lines = [
            describe_profile(self.profile, loader_workers=self.loader_workers),
            f"settled for {self.device} ({how} profile)",
        ]
        if self.remedy:  # a run that fits as asked has nothing to say here
            lines.append(f"remedy: {' '.join(self.remedy)}")
        lines.append(f"settlement overrides: {' '.join(self.overrides) or '(none)'}")
        return "\n".join(lines)


def settle(
    cfg: DictConfig,
    *,
    device: DeviceInfo | None = None,
    plan_batches: bool = True,
    plan_inference: bool = False,
    check_device: bool = True,
    user_overrides: Sequence[str] | None = None,
    config_name: str | None = None,
) -> Settlement:
    """Settle the hardware profile of `cfg` (the user's composed config, left unchanged).

    `device` is probed when None (and ignored with `check_device=False`, a preview for the
    profile's own hardware). `user_overrides` and `config_name` default to the running Hydra
    app's (its command-line overrides, `hydra.searchpath` included, and primary config).
    `plan_inference` (eval.py): a GPU profile's `val_batch_size` comes from an inference-only plan.
    Raises what `resolve_hardware` raises: `ProfileError`, `HardwareMismatchError`,
    `DoesNotFitError`. Where `cfg` is not what its overrides compose to (changed in code), the
    changes are kept as overrides (`Settlement.in_code`).
    """
    user = tuple(_given_overrides() if user_overrides is None else user_overrides)
    name = config_name or _config_name()
    conf_dir = Path(cfg.paths.conf_dir)

    in_code = _changes_as_overrides(
        OmegaConf.to_container(compose_run(name, user, conf_dir=conf_dir), resolve=False),
        OmegaConf.to_container(cfg, resolve=False),
    )

    def compose_with(extra: Sequence[str]) -> DictConfig:
        return compose_run(name, [*user, *in_code, *extra], conf_dir=conf_dir)

    if check_device and device is None:
        device = probe_device()
    records: list[dict] = []
    with _logged_decisions() as decisions:
        settled = hardware.resolve_hardware(
            copy.deepcopy(cfg),
            conf_dir=conf_dir,
            device=device,
            plan_batches=plan_batches,
            check_device=check_device,
            fit_records=records,
            compose_with=compose_with,
            plan_inference=plan_inference,
        )
    profile_file = conf_dir / "hw" / f"{settled.profile.name}.yaml"
    chosen = (
        (f"+hw={settled.profile.name}",)
        if settled.requested.detected and cfg.get("hw") is None and profile_file.is_file()
        else ()
    )
    base = (*settled.remedy, *chosen)
    run = compose_with(base)
    composed = run.get("hw")
    given = OmegaConf.to_container(composed, resolve=True) if composed is not None else {}
    wanted = settled.profile.model_dump()
    fields = tuple(
        f"++hw.{key}={_override_value(value)}"
        for key, value in wanted.items()
        if key not in given or given[key] != _container_value(value)
    )
    return Settlement(
        profile=settled.profile,
        device=device.describe() if check_device and device else "its own hardware (a preview)",
        detected=settled.requested.detected,
        remedy=settled.remedy,
        fit_records=tuple(records),
        decisions=tuple(decisions),
        user_overrides=user,
        in_code=in_code,
        overrides=(*base, *fields),
        config_name=name,
        conf_dir=str(conf_dir),
        loader_workers=_loader_workers(run, settled.profile),
    )


def _loader_workers(run: DictConfig, profile: HardwareProfile) -> int | None:
    # data.num_workers follows the profile (${hw.num_workers}) unless a debug config or the user
    # set it: the console then shows what the loaders get, not the profile's unused value.
    data = run.get("data")
    if not isinstance(data, DictConfig) or "num_workers" not in data:
        return None
    raw = OmegaConf.to_container(data, resolve=False)["num_workers"]
    if raw == "${hw.num_workers}":
        return profile.num_workers
    return raw if isinstance(raw, int) else None


def _changes_as_overrides(composed: object, changed: object, key: str = "") -> tuple[str, ...]:
    """The overrides that turn the config `composed` into `changed` (both as containers): one
    `++key=value` for each leaf added or changed, one `~key` for each key removed."""
    if isinstance(composed, dict) and isinstance(changed, dict):
        overrides: list[str] = []
        for name in [*composed, *(k for k in changed if k not in composed)]:
            path = f"{key}.{name}" if key else str(name)
            if name not in changed:
                overrides.append(f"~{path}")
            elif name not in composed:
                overrides.append(f"++{path}={_override_value(changed[name])}")
            else:
                overrides.extend(_changes_as_overrides(composed[name], changed[name], path))
        return tuple(overrides)
    if composed == changed:
        return ()
    return (f"++{key}={_override_value(changed)}",)


class SettlementMismatch(RuntimeError):
    """The run's config, composed from the settlement's overrides, is not what was settled."""


def settled_config(settlement: Settlement) -> DictConfig:
    """The run's config: `settlement.run_overrides` composed through Hydra's public API.

    Raises `SettlementMismatch` (a defect, not a user's mistake) when its `hw` node is not
    the settled profile.
    """
    cfg = compose_run(
        settlement.config_name, settlement.run_overrides, conf_dir=Path(settlement.conf_dir)
    )
    wanted = {k: _container_value(v) for k, v in settlement.profile.model_dump().items()}
    got = OmegaConf.to_container(cfg.hw, resolve=True) if "hw" in cfg else {}
    if got != wanted:
        differ = sorted(k for k in wanted if got.get(k, "<absent>") != wanted[k])
        raise SettlementMismatch(f"the composed run's hw differs from the settlement in {differ}")
    return cfg


def write_overrides(output_dir: Path, settlement: Settlement, name: str = RUN_OVERRIDES) -> Path:
    """Write the run's overrides into `output_dir/<name>`, one a line; return the path.

    `xargs -d '\\n' python train.py < overrides.txt` (or `python train.py $(cat overrides.txt)`
    when no value holds a space) composes the run's config again, batch sizes explicit.
    """
    path = Path(output_dir) / name
    path.write_text("".join(f"{override}\n" for override in settlement.run_overrides))
    return path


def _given_overrides() -> tuple[str, ...]:
    """The running Hydra app's overrides that shape its job config: the task's, after any
    `hydra.searchpath=…` (a config tree beside `conf/`, e.g. a workload of one's own)."""
    if not HydraConfig.initialized():
        return ()
    hydra_overrides = OmegaConf.to_container(HydraConfig.get().overrides.hydra, resolve=False)
    search = tuple(o for o in hydra_overrides if override_key(o) == "hydra.searchpath")
    return (*search, *command_line_overrides())


def _config_name() -> str:
    if HydraConfig.initialized():
        return str(HydraConfig.get().job.config_name)
    return "train"


def _container_value(value: object) -> object:
    # A tuple field (fit_allow) reads back from a config as a list.
    return list(value) if isinstance(value, tuple) else value


def _override_value(value: object) -> str:
    """`value` as Hydra's override grammar reads it back: plain where that round-trips, quoted
    otherwise (a string that would read as a number, or holds spaces or quotes)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, tuple | list):
        return "[" + ",".join(_override_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{_override_value(v)}" for k, v in value.items()) + "}"
    text = str(value)
    if isinstance(value, str):
        parsed = _parsed(text)
        if parsed != value or not isinstance(parsed, str) or text != text.strip() or " " in text:
            quote = '"' if "'" in text else "'"
            return f"{quote}{text}{quote}"
    return text


def _parsed(text: str) -> object:
    try:
        return OverridesParser.create().parse_override(f"key={text}").value()
    except Exception:  # any text the grammar refuses is quoted instead
        return None


@contextmanager
def _logged_decisions() -> Iterator[list[str]]:
    """The `hw:` lines `resolve_hardware` logs while inside, collected in order."""
    lines: list[str] = []

    class Collector(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage().removeprefix("hw: "))

    logger = logging.getLogger(hardware.__name__)
    level, propagate = logger.level, logger.propagate
    if not logger.isEnabledFor(logging.INFO):
        # Collected although nobody shows INFO lines: kept from the other handlers, as before.
        logger.setLevel(logging.INFO)
        logger.propagate = False
    collector = Collector(logging.INFO)
    logger.addHandler(collector)
    try:
        yield lines
    finally:
        logger.removeHandler(collector)
        logger.setLevel(level)
        logger.propagate = propagate
