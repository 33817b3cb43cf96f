"""Settle, then compose: the two compositions of every run.

1. Hydra composes the config the user asked for; no value of it plans anything (the trainer and
   data configs read the profile as plain ``${hw.…}`` interpolations, ``auto`` included).
2. ``settle(cfg)`` decides what the profile leaves open (detection, device check, the automatic
   fit, ``auto`` batch sizes, accumulation:
   `vramkit.core.run.settling.resolve_hardware.settle_profile`)
   and returns a ``Settlement``: a frozen, printable record of the decisions, their lines and
   records, and the overrides that, appended to the user's, say all of it
   (``hw.batch_size=826``, ``+hw=t4`` for a detected profile, a remedy's ``trainer=…``).
   Nothing is printed or written while deciding: the run does both after (`log_decisions`,
   `write_overrides`, ``train()``'s records).
3. ``settled_config(settlement)`` composes the run's config once more, through Hydra's public
   compose API, from ``settlement.run_overrides``: what ``python train.py <run_overrides>``
   composes, the run folder's ``overrides.txt``. (An automatic fit that applies a remedy
   composes the user's overrides with the remedy once in between, to plan the remedied run.)
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from lightning.fabric.utilities.rank_zero import rank_zero_only
from omegaconf import DictConfig, OmegaConf

from vramkit.core.config.schema import ConfigError
from vramkit.core.config.source import command_line_overrides, override_key
from vramkit.core.hardware.detect import DeviceInfo, probe_device
from vramkit.core.hardware.profile import HardwareProfile, describe_profile
from vramkit.core.run.folder.run_folder import RUN_OVERRIDES
from vramkit.core.run.settling.compose import compose_run, edited_since_composed
from vramkit.core.run.settling.resolve_hardware import settle_profile

log = logging.getLogger(__name__)


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
    remedy_record: dict[str, Any] | None
    """What the automatic fit decided and why (the run folder's `fit_decision.json`); None when
    the requested run fit or was not planned."""
    memory_plan: dict[str, Any] | None
    """The planner's predicted peaks at the settled batch sizes (the run folder's
    `memory_plan.json`); None when nothing was planned."""
    decisions: tuple[str, ...]
    """Each decision, in the order taken: detection, mapping, fit, batch sizes (`log_decisions`
    logs them as `hw: …` lines)."""
    user_overrides: tuple[str, ...]
    """The overrides the user gave (the command line)."""
    applied: tuple[str, ...]
    """Overrides the run adds to the user's before the settlement's: a resume's verdict
    (`++resume.changes=[…]`, `vramkit.core.run.resume_contract.ResumeVerdict`)."""
    overrides: tuple[str, ...]
    """The settlement's own overrides, appended to the user's to compose the run's config."""
    config_name: str
    """The primary config composed ("train", "eval")."""
    conf_dir: str
    """The config tree it was composed from."""
    loader_workers: int | None = None
    """The worker processes the run's loaders get (``data.num_workers``, the profile's
    ``num_workers`` unless set otherwise); None when the config does not say."""
    warnings: tuple[str, ...] = ()
    """What a resume changed of the decisions (`keep_trained_batch`: a regrouped batch), logged
    as warnings after them."""

    @property
    def run_overrides(self) -> tuple[str, ...]:
        """The user's overrides, the run's applied ones, and then the settlement's: the run's
        whole command line."""
        return (*self.user_overrides, *self.applied, *self.overrides)

    def __str__(self) -> str:
        """The profile as the console shows it, what chose it, the remedy (when the automatic fit
        applied one) and the overrides (the decisions are logged before, `log_decisions`)."""
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
    applied: Sequence[str] = (),
) -> Settlement:
    """Settle the hardware profile of `cfg` (what the user's overrides compose to, left
    unchanged: `settled_config` composes from the overrides, not from `cfg`).

    `device` is probed when None (and ignored with `check_device=False`, a preview for the
    profile's own hardware). `user_overrides` and `config_name` default to the running Hydra
    app's (its command-line overrides, `hydra.searchpath` included, and primary config);
    `applied` are the run's own overrides composed after them (`Settlement.applied`).
    `plan_inference` (eval.py): a GPU profile's `val_batch_size` comes from an inference-only plan.
    Raises `ConfigError` for keys of `cfg` edited in code after `compose_config` returned it (the
    run is composed from the overrides, so such an edit would be silently lost), and what
    `settle_profile` raises: `ProfileError`, `HardwareMismatchError`, `DoesNotFitError`.
    """
    edited = edited_since_composed(cfg)
    if edited:
        raise ConfigError(
            f"{', '.join(edited)}: changed in code after the config was composed, which the run "
            "would not see (it is composed from the overrides); give "
            f"{'them' if len(edited) > 1 else 'it'} as overrides instead, e.g. "
            f"compose_config(..., '{edited[0]}=<value>')",
            tuple(edited),
        )
    user = tuple(_given_overrides() if user_overrides is None else user_overrides)
    name = config_name or _config_name()
    conf_dir = Path(cfg.paths.conf_dir)

    def compose_with(extra: Sequence[str]) -> DictConfig:
        return compose_run(name, [*user, *applied, *extra], conf_dir=conf_dir)

    if check_device and device is None:
        device = probe_device()
    settled = settle_profile(
        cfg,
        conf_dir=conf_dir,
        device=device,
        plan_batches=plan_batches,
        check_device=check_device,
        compose_with=compose_with,
        plan_inference=plan_inference,
    )
    requested = settled.requested
    profile_file = conf_dir / "hw" / f"{settled.profile.name}.yaml"
    chosen = (
        (f"+hw={settled.profile.name}",)
        if requested.detected and cfg.get("hw") is None and profile_file.is_file()
        else ()
    )
    # What the run's composition gives `hw` before the fields below: the chosen profile's file
    # (a remedy's hw keys on top), or the `hw` node the user's and the remedy's overrides gave.
    composed = (requested.values if chosen else requested.given) or {}
    fields = tuple(
        f"++hw.{key}={override_text(value)}"
        for key, value in settled.profile.model_dump().items()
        if key not in composed or composed[key] != _container_value(value)
    )
    return Settlement(
        profile=settled.profile,
        device=device.describe() if check_device and device else "its own hardware (a preview)",
        detected=requested.detected,
        remedy=settled.remedy,
        remedy_record=settled.remedy_record,
        memory_plan=settled.memory_plan,
        decisions=settled.lines,
        user_overrides=user,
        applied=tuple(applied),
        overrides=(*settled.remedy, *chosen, *fields),
        config_name=name,
        conf_dir=str(conf_dir),
        loader_workers=_loader_workers(cfg, settled.profile),
    )


@rank_zero_only
def log_decisions(settlement: Settlement) -> None:
    """Log each decision of `settlement` as an `hw: …` line, then its warnings, once (rank zero
    of a DDP run)."""
    # Log records, not prints: `--cfg job` output stays plain YAML.
    for line in settlement.decisions:
        log.info("hw: %s", line)
    for line in settlement.warnings:
        log.warning(line)


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


_PLAIN = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_\-./]*")
"""Text Hydra's override grammar reads back as the same string when written unquoted: word
characters, `-`, `.` and `/`, not first a sign or a dot (hydra/grammar/OverrideLexer.g4:
`ID`, `UNQUOTED_CHAR`)."""

_KEYWORDS = {"true", "false", "null", "nan", "inf"}
"""Words the grammar reads as a bool, None or a float, in any case (OverrideLexer.g4: `BOOL`,
`NULL`, `FLOAT`)."""


def override_text(value: object) -> str:
    """`value` as Hydra's override grammar reads it back: plain where the text is `_PLAIN` and
    reads as no number or keyword, quoted otherwise (a string that would read as a number, or
    holds spaces, quotes, backslashes or `$`)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, tuple | list):
        return "[" + ",".join(override_text(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{override_text(v)}" for k, v in value.items()) + "}"
    text = str(value)
    if isinstance(value, str) and not _plain(text):
        quote = '"' if "'" in text else "'"
        return f"{quote}{text}{quote}"
    return text


def _plain(text: str) -> bool:
    if not _PLAIN.fullmatch(text) or text.lower() in _KEYWORDS:
        return False
    try:
        float(text)  # 7.5, 1e3, 1_000: the grammar reads them as numbers
    except ValueError:
        return True
    return False
