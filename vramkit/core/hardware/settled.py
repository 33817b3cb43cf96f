"""Whether a config's ``${resolved_hw:…}`` interpolations read its ``hw`` node as it stands.

A run settles its hardware profile once (device check, planning) and writes the result into
``cfg.hw``; from then on, and while the settling itself builds objects from the config, the
interpolations read ``cfg.hw``. A config nobody settled is previewed instead
(``vramkit.core.run.resolvers``). The state is an OmegaConf flag on the config's root, so it
travels with deep copies of the config.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from omegaconf import DictConfig

_SETTLED_FLAG = "vramkit_hw_settled"
_SETTLING_FLAG = "vramkit_hw_settling"


def mark_settled(cfg: DictConfig) -> None:
    """Say that ``cfg.hw`` now holds the profile values the run uses."""
    cfg._set_flag(_SETTLED_FLAG, True)


@contextmanager
def settling(cfg: DictConfig) -> Iterator[None]:
    """While inside, ``cfg.hw`` is read as it stands (the profile being settled)."""
    cfg._set_flag(_SETTLING_FLAG, True)
    try:
        yield
    finally:
        cfg._set_flag(_SETTLING_FLAG, None)


def reads_hw_node(cfg: DictConfig) -> bool:
    """True when ``cfg.hw`` is settled or being settled, so interpolations read it directly."""
    return bool(cfg._get_node_flag(_SETTLED_FLAG) or cfg._get_node_flag(_SETTLING_FLAG))
