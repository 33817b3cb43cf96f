"""Hydra's refusals of a command-line key, in one line of vramkit's, with the right fix first.

Hydra refuses an override of a key the config does not have (``trainer.max_epoch=3``: "Key
'max_epoch' is not in struct") and an added key the config already has (``+trainer.max_epochs=3``)
while composing, before any vramkit code runs. It prints seven lines whose first advice,
``+trainer.max_epoch=3``, is the wrong fix (a key nothing reads, then refused by
:mod:`vramkit.core.config.added_keys`), and exits with status 1.

`did_you_mean_on_refusal` wraps an entry point: standard error is held while Hydra composes
(:mod:`vramkit.core.run.refusal.held_stderr`); when Hydra refused the command line, the command line
is
composed again to find the key, and Hydra's lines give way to one line: the closest existing key
with the value (``did you mean trainer.max_epochs=3?``), or ``+key=value`` where the key is
genuinely new and something reads it (a Lightning Trainer argument, a hardware profile field on
top of the detected profile). Exit status 2, as for every refusal. A refusal this module cannot
explain keeps Hydra's own lines. Only a refused command pays for the second composition.
"""

from __future__ import annotations

import contextlib
import difflib
import inspect
import re
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from hydra.core.hydra_config import HydraConfig
from hydra.errors import ConfigCompositionException
from omegaconf import DictConfig, OmegaConf

from vramkit.core.config.source import override_key
from vramkit.core.hardware.profile import HardwareProfile
from vramkit.core.run.refusal.exit_codes import EXIT_REFUSED
from vramkit.core.run.refusal.held_stderr import hold_stderr
from vramkit.core.run.settling.compose import compose_config, forget_composition

_NOT_IN_STRUCT = re.compile(r"full_key: (?P<key>[\w.\-]+)")
_ALREADY_THERE = re.compile(r"An item is already at '(?P<key>[\w.\-]+)'")
_CLOSE = 0.6
"""difflib ratio from which an unknown key reads as a misspelling of an existing one."""


@contextlib.contextmanager
def did_you_mean_on_refusal(config_name: str, argv: Sequence[str] | None = None) -> Iterator[None]:
    """Around ``@hydra.main``'s entry: when Hydra refuses a key of the command line (exit status
    1, before the run starts), its lines give way to one ``error: …`` line and exit status 2."""
    with hold_stderr() as held:
        try:
            yield
        except SystemExit as stop:
            if stop.code != 1 or not held.holding:
                raise
            refusal = override_refusal(config_name, sys.argv[1:] if argv is None else argv)
            if refusal is None:
                raise
            held.discard()
            print(f"error: {refusal}", file=sys.stderr)
            raise SystemExit(EXIT_REFUSED) from None


def override_refusal(config_name: str, overrides: Sequence[str]) -> str | None:
    """What is wrong with the first override Hydra refuses and how to fix it, in one line; None
    when Hydra accepts ``overrides`` or refuses them for another reason."""
    plain = [o for o in overrides if not o.startswith("-") and "=" in o]
    try:
        first = _refused_key(config_name, plain)
        if first is None or first[1] is None:
            return None  # accepted, or refused for another reason: Hydra's own lines say why
        key_name, present = first
        override = next((o for o in reversed(plain) if _sets(o, key_name)), None)
        if override is None:
            return None  # not a key of the command line
        # The config without every refused override: the one its parent node is read from.
        rest, refused = list(plain), first
        while refused is not None:
            kept = [o for o in rest if not _sets(o, refused[0])]
            if refused[1] is None or len(kept) == len(rest):
                return None
            rest = kept
            refused = _refused_key(config_name, rest)
        cfg = compose_config(config_name, rest)
        if present:
            return _already_there(cfg, override)
        return _unknown(cfg, override, key_name)
    finally:
        forget_composition()


def _refused_key(config_name: str, overrides: list[str]) -> tuple[str, bool | None] | None:
    """None when Hydra composes ``overrides``; else the key it refused and whether it refused it
    as already present (True), absent (False), or for another reason (None)."""
    try:
        compose_config(config_name, overrides)
        return None
    except ConfigCompositionException as error:
        unknown = _NOT_IN_STRUCT.search(str(error.__cause__ or error))
        if unknown is not None:
            return unknown.group("key"), False
        present = _ALREADY_THERE.search(str(error))
        if present is not None:
            return present.group("key"), True
        return "", None


def _sets(override: str, key: str) -> bool:
    return override_key(override) == key or override_key(override).startswith(f"{key}.")


@dataclass(frozen=True)
class _Override:
    key: str
    value: str

    @classmethod
    def parse(cls, override: str) -> _Override:
        return cls(override_key(override), override.split("=", 1)[1])


def _file_of(parent_key: str) -> str:
    group = parent_key.split(".")[0]
    choices = HydraConfig.get().runtime.choices if HydraConfig.initialized() else {}
    return f" (conf/{group}/{choices[group]}.yaml)" if choices.get(group) else ""


def _already_there(cfg: DictConfig, override: str) -> str:
    given = _Override.parse(override)
    parent_key = given.key.rpartition(".")[0]
    return (
        f"{override}: {given.key} is already in the config{_file_of(parent_key)}; set it "
        f"without the plus: {given.key}={given.value}"
    )


def _unknown(cfg: DictConfig, override: str, unknown: str) -> str | None:
    given = _Override.parse(override)
    if unknown == "hw" and "hw" not in cfg:
        return _profile_key_without_profile(override, given)
    parent_key, _, name = unknown.rpartition(".")
    parent = OmegaConf.select(cfg, parent_key) if parent_key else cfg
    if not isinstance(parent, DictConfig):
        return None
    where = f"{parent_key or 'the config'}{_file_of(parent_key)} has no key {name!r}"
    if name in _readable_new_keys(parent_key) and unknown == given.key:
        return f"{override}: {where}; it is a new key there: +{given.key}={given.value}"
    close = difflib.get_close_matches(name, [str(k) for k in parent], n=1, cutoff=_CLOSE)
    if close:
        near = f"{parent_key}.{close[0]}" if parent_key else close[0]
        # model.optimzer.lr=0.1 is refused at model.optimzer: the fix keeps the rest of its key
        return f"{override}: {where}; did you mean {near}{given.key[len(unknown) :]}={given.value}?"
    return f"{override}: {where}"


def _profile_key_without_profile(override: str, given: _Override) -> str:
    name = given.key.removeprefix("hw.")
    fields = list(HardwareProfile.model_fields)
    if name in fields:
        return (
            f"{override}: no hardware profile was chosen, so hw.* keys go on top of the detected "
            f"one with a plus: +{given.key}={given.value} (or after a profile: +hw=t4 "
            f"{given.key}={given.value})"
        )
    close = difflib.get_close_matches(name, fields, n=1, cutoff=_CLOSE)
    near = f"; did you mean +hw.{close[0]}={given.value}?" if close else ""
    return f"{override}: a hardware profile has no key {name!r}{near}"


def _readable_new_keys(parent_key: str) -> set[str]:
    """Keys absent from a node that something still reads when added with ``+``."""
    if parent_key == "trainer":
        # Imported here: only a refused command line needs Lightning's Trainer signature.
        from lightning import Trainer

        return set(inspect.signature(Trainer.__init__).parameters) - {"self"}
    return set()
