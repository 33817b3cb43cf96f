"""`+key=value` adds a key; a misspelt one (`+ckpt_pth=…`) would be silently ignored by the run.

Hydra lets `+` add any key, so a typo of an existing key becomes a new key nobody reads: the run
trains from scratch while the user thinks it resumes. An added key whose name is within a typo of a
key beside it is refused with that key's name; `++key=value` adds it anyway.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from vramkit.core.config.schema import ConfigError
from vramkit.core.config.source import override_key

_TYPO_CUTOFF = 0.8
"""difflib ratio from which a new key reads as a misspelling of its neighbour."""


def check_added_keys(cfg: DictConfig, overrides: Sequence[str], conf_dir: Path) -> None:
    """Refuse `+a.b=v` overrides whose key `b` looks like a misspelling of a sibling of `b`."""
    added = {override_key(o) for o in overrides if o.startswith("+")}
    problems = []
    for override in overrides:
        if not override.startswith("+") or override.startswith("++"):
            continue
        key = override_key(override)
        if "." not in key and (Path(conf_dir) / key).is_dir():
            continue  # a config group chosen with +group=option (+hw=t4)
        parent, _, name = key.rpartition(".")
        node = OmegaConf.select(cfg, parent) if parent else cfg
        if not isinstance(node, DictConfig):
            continue
        # Only keys the files define: two keys added together (limit_train_batches and
        # limit_val_batches) are not each other's misspelling.
        prefix = f"{parent}." if parent else ""
        siblings = [str(sibling) for sibling in node if f"{prefix}{sibling}" not in added]
        match = difflib.get_close_matches(name, siblings, n=1, cutoff=_TYPO_CUTOFF)
        if match:
            near = f"{parent}.{match[0]}" if parent else match[0]
            value = override.split("=", 1)[1] if "=" in override else "…"
            problems.append(
                f"{override} adds a new key {key!r} that nothing reads; did you mean {near}? "
                f"(write {near}={value}, or ++{key}={value} to add it anyway)"
            )
    if problems:
        raise ConfigError("\n".join(problems), ())
