"""The settings of every configured component, checked before any work.

A component names its settings class in ``settings_class`` (see `vramkit.core.config.settings`);
its config node holds ``_target_`` and the settings' keys. `check_component_settings` checks the
nodes of a composed config against those classes, so a misspelt key or a bad value of a callback
is refused before the hardware is planned, a run folder written or data read. Values that are
interpolations are left to the component itself, which validates them when it is built: resolving
one here could run work (a profile's value) that the early check must not.
"""

from __future__ import annotations

import inspect
import json
import re
from collections.abc import Iterator
from typing import Any

from hydra.utils import get_object
from omegaconf import DictConfig, OmegaConf

from vramkit.core.config.legacy_targets import current_target
from vramkit.core.config.schema import ConfigError, settings_error, settings_heading
from vramkit.core.config.settings import Settings
from vramkit.core.config.source import ConfigSource, source_of

NODE_KEYS = ("_target_", "_partial_", "_convert_", "_recursive_", "_args_")
"""Hydra's own keys of a node, which are no settings."""


LIBRARY_SETTINGS = {
    "lightning.pytorch.Trainer": "vramkit.core.config.trainer_schema.TrainerSettings",
}
"""The settings class vramkit keeps for another library's component, which cannot name one in a
``settings_class``: its config file's ``???`` keys read their defaults from that class (named
by its own path, so composing imports no Lightning and a record's value is vramkit's own,
`vramkit.core.config.settings_schemas.OWN_COMPONENTS`). Its node is not checked as a whole by
`check_component_settings` (it holds the library's other keys too): the class checks its keys."""


def defaults_target(target: str) -> str:
    """What a ``${settings_default:<target>,<key>}`` of the component `target` names: its
    `LIBRARY_SETTINGS` class, else the target itself."""
    return LIBRARY_SETTINGS.get(target, target)


def settings_class_of(target: str) -> type[Settings] | None:
    """The settings class of the component a ``_target_`` names (or the settings class it
    names itself, `LIBRARY_SETTINGS`), or None when it has none (or the target cannot be
    imported: instantiating it reports that)."""
    try:
        component = get_object(current_target(target))
    except Exception:
        return None
    if isinstance(component, type) and issubclass(component, Settings):
        return component
    schema = getattr(component, "settings_class", None)
    return schema if isinstance(schema, type) and issubclass(schema, Settings) else None


def signature_default(target: str, key: str) -> Any:
    """The default of the keyword `key` of the component `target` names (its class's
    ``__init__``, or the function), as a config holds it (plain JSON values): the one place of
    the defaults of a component without a settings class (a task's network or LightningModule).
    Raises `ValueError` when it has no such default, or one that is no plain value."""
    try:
        parameters = inspect.signature(get_object(current_target(target))).parameters
    except Exception as error:
        raise ValueError(f"{target}: no signature to take the default of {key} from") from error
    parameter = parameters.get(key)
    if parameter is None or parameter.default is inspect.Parameter.empty:
        raise ValueError(f"{target} has no default for {key}")
    try:
        return json.loads(json.dumps(parameter.default))
    except TypeError:
        raise ValueError(f"{target}'s default of {key} is no config value") from None


def component_nodes(cfg: DictConfig, prefix: str = "") -> Iterator[tuple[str, DictConfig]]:
    """Every node below `cfg` with a ``_target_``, with its dotted key ("callbacks.run_report")."""
    for key in cfg:
        if not isinstance(key, str) or OmegaConf.is_missing(cfg, key):
            continue
        if OmegaConf.is_interpolation(cfg, key):
            continue
        node = cfg[key]
        if isinstance(node, DictConfig):
            if "_target_" in node:
                yield f"{prefix}{key}", node
            yield from component_nodes(node, f"{prefix}{key}.")


def check_component_settings(cfg: DictConfig) -> None:
    """Raise one `ConfigError` for the first component node whose keys or plain values its
    settings class refuses; the message names the key, the file and the closest valid key."""
    for key, node in component_nodes(cfg):
        schema = settings_class_of(str(node._target_))
        if schema is None:
            continue
        left_out = {str(name) for name in node if _unknown_yet(node, str(name))}
        values = {
            name: node[name] for name in node if name not in NODE_KEYS and name not in left_out
        }
        prefix, source = f"{key}.", _source(key)
        try:
            schema.from_config(values, key_prefix=prefix, source=source)
        except ConfigError as error:
            # what a left-out key holds is known only once resolved: not missing, nor judged
            problems = [p for p in error.problems if p[0].split(".")[0] not in left_out]
            if problems:
                heading = settings_heading(schema, prefix, None)
                raise settings_error(problems, heading, prefix, source) from None


def _unknown_yet(node: DictConfig, key: str) -> bool:
    """Whether the value of `key` is missing (``???``) or is or holds an interpolation: known
    only once resolved, which the early check must not do. A class default
    (``${settings_default:…}``, `vramkit.core.config.settings_schemas`) is known: reading it
    imports the component's module, which this check has imported already."""
    if OmegaConf.is_missing(node, key):
        return True
    raw = OmegaConf.to_container(node, resolve=False)[key]
    return _OTHER_INTERPOLATION.search(str(raw)) is not None


_OTHER_INTERPOLATION = re.compile(r"\$\{(?!settings_default:)")
"""An interpolation that is no class default."""


def _source(key: str) -> ConfigSource:
    group, _, rest = key.partition(".")
    if group == "callbacks" and rest:
        return source_of("callbacks", node=rest.split(".")[0])
    return source_of(group)
