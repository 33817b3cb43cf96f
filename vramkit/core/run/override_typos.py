"""A misspelt key on the command line (`model.optimzer.lr=0.1`) gets the key it resembles.

Hydra refuses an override of a key the config does not have ("Key 'optimzer' is not in struct")
while composing, before any vramkit code runs, and names neither the file nor the key meant.
`did_you_mean_on_refusal` wraps an entry point: when Hydra's composition refused the command
line, it composes again to find the unknown key, and prints the closest existing key beside it
with the file its parent node comes from. Only a refused command pays for the second composition.
"""

from __future__ import annotations

import contextlib
import difflib
import re
import sys
from collections.abc import Iterator, Sequence

from hydra.core.hydra_config import HydraConfig
from hydra.errors import ConfigCompositionException
from omegaconf import DictConfig, OmegaConf

from vramkit.core.config.source import override_key
from vramkit.core.run.compose import compose_config, forget_composition

_NOT_IN_STRUCT = re.compile(r"full_key: (?P<key>[\w.\-]+)")


@contextlib.contextmanager
def did_you_mean_on_refusal(config_name: str, argv: Sequence[str] | None = None) -> Iterator[None]:
    """Around ``@hydra.main``'s entry: after Hydra refuses an unknown key (exit status 1), print
    the closest valid key on the last line."""
    try:
        yield
    except SystemExit as stop:
        if stop.code == 1:
            hint = unknown_key_hint(config_name, sys.argv[1:] if argv is None else argv)
            if hint:
                print(hint, file=sys.stderr)
        raise


def unknown_key_hint(config_name: str, overrides: Sequence[str]) -> str | None:
    """ "did you mean …" for the first override whose key the composed config lacks, or None."""
    plain = [o for o in overrides if not o.startswith("-") and "=" in o]
    try:
        compose_config(config_name, plain)
        return None
    except ConfigCompositionException as error:
        found = _NOT_IN_STRUCT.search(str(error.__cause__ or error))
        if found is None:
            return None
        unknown = found.group("key")
        rest = [o for o in plain if override_key(o) != unknown and not _below(o, unknown)]
        try:
            cfg = compose_config(config_name, rest)
        except ConfigCompositionException:
            return None
        return _hint(cfg, unknown)
    finally:
        forget_composition()


def _below(override: str, key: str) -> bool:
    return override_key(override).startswith(f"{key}.")


def _hint(cfg: DictConfig, unknown: str) -> str | None:
    if unknown == "hw" and "hw" not in cfg:
        return (
            "hint: no hardware profile was chosen, so hw.* keys go on top of the detected one "
            "with a plus (+hw.batch_size=8), or after a profile (+hw=t4 hw.batch_size=8)"
        )
    parent_key, _, name = unknown.rpartition(".")
    parent = OmegaConf.select(cfg, parent_key) if parent_key else cfg
    if not isinstance(parent, DictConfig):
        return None
    close = difflib.get_close_matches(name, [str(k) for k in parent], n=1, cutoff=0.6)
    where = parent_key or "the config"
    group = parent_key.split(".")[0]
    choices = HydraConfig.get().runtime.choices if HydraConfig.initialized() else {}
    file = f" (conf/{group}/{choices[group]}.yaml)" if group in choices else ""
    if not close:
        return f"hint: {where}{file} has no key {name!r}"
    near = f"{parent_key}.{close[0]}" if parent_key else close[0]
    return f"hint: {where}{file} has no key {name!r}; did you mean {near}?"
