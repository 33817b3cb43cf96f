"""Where a config's values came from: the YAML file of its group and the command-line overrides.

An error about a config value points the user there: ``conf/data/icdar2015.yaml``, plus the
override ``data.batch_size=x`` when one set the key.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass

from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf


@dataclass(frozen=True)
class ConfigSource:
    """The file a config's values came from, and the command-line overrides that touched it.

    `file` is the file as the user knows it ("conf/hw/t4.yaml") or, where there is no file to
    name (a config built in code, a generated profile), a description ("the data config").
    """

    file: str
    overrides: tuple[str, ...] = ()

    def override_for(self, key: str) -> str | None:
        """The last command-line override that set the dotted `key` ("data.batch_size"), or None."""
        setters = [o for o in self.overrides if override_key(o) == key]
        return setters[-1] if setters else None


def override_key(override: str) -> str:
    """The dotted key of a Hydra override: '+hw.precison=16-mixed' -> 'hw.precison'."""
    return override.lstrip("+~").split("=", 1)[0].strip()


def closest(word: str, choices: tuple[str, ...] | list[str]) -> str | None:
    """The valid choice nearest to a misspelt `word` (difflib), or None when nothing is close."""
    matches = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return matches[0] if matches else None


def command_line_overrides() -> tuple[str, ...]:
    """The running Hydra app's command-line overrides, as typed; () outside a Hydra app.

    Read without resolving: an override may hold an interpolation (``data.batch_size=
    ${hw.batch_size}``) that is the user's text here, not a value to compute.
    """
    if not HydraConfig.initialized():
        return ()
    return tuple(OmegaConf.to_container(HydraConfig.get().overrides.task, resolve=False))


def source_of(group: str, *, node: str | None = None) -> ConfigSource:
    """The file and overrides of config group `group` ("data") in the running Hydra app.

    The file is ``conf/<group>/<choice>.yaml`` for the group's chosen option; `node` names a
    config of the group that the chosen one includes through its defaults list (the callbacks:
    ``source_of("callbacks", node="max_time_annealing")`` names
    conf/callbacks/max_time_annealing.yaml).
    The overrides are those of the task that set a key below the group (or below the node).
    Without an initialised Hydra (objects built in code, tests) the source is described as
    "the <group> config". A key that is no group (``+fault.…``) has no file, only overrides.
    """
    if not HydraConfig.initialized():
        return ConfigSource(f"the {group} config")
    hydra_cfg = HydraConfig.get()
    choice = hydra_cfg.runtime.choices.get(group)
    scope = group if node is None else f"{group}.{node}"
    overrides = tuple(
        o
        for o in command_line_overrides()
        if override_key(o) == scope or override_key(o).startswith(f"{scope}.")
    )
    if choice is None:
        return ConfigSource(f"the {group} config", overrides)
    return ConfigSource(f"conf/{group}/{node or choice}.yaml", overrides)
