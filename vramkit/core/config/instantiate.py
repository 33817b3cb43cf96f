"""The one place where config nodes become objects."""

from __future__ import annotations

import logging
from typing import Any

import hydra
from hydra.errors import InstantiationException
from omegaconf import DictConfig

from vramkit.core.config.legacy_targets import upgrade_targets
from vramkit.core.config.schema import ConfigError

log = logging.getLogger(__name__)


def instantiate(node: DictConfig, **kwargs: Any) -> Any:
    """Build the object a config node describes with ``_target_``; ``kwargs`` add to its fields.

    ``_target_`` paths of vramkit's old layout still work (``legacy_targets``), with a warning.
    A settings check failing inside the constructor (a ``ConfigError``) is raised as itself, not
    wrapped in Hydra's ``InstantiationException``, so the run refuses with its message alone.
    """
    if "_target_" not in node:
        raise ValueError(f"config node has no _target_: keys are {sorted(node.keys())}")
    try:
        return hydra.utils.instantiate(upgrade_targets(node), **kwargs)
    except InstantiationException as error:
        if isinstance(error.__cause__, ConfigError):
            raise error.__cause__ from None
        raise


def instantiate_group(group: DictConfig | None) -> list[Any]:
    """Build every entry of a group such as ``callbacks`` or ``logger`` (name → node), in order.

    An entry set to null (``callbacks.learning_rate_monitor=null``) is left out; a settings
    check failing in a constructor is raised as itself, as in `instantiate`.
    """
    objects = []
    for name, node in (group or {}).items():
        if node is None:
            continue
        if not isinstance(node, DictConfig) or "_target_" not in node:
            raise ValueError(f"{name}: a group entry needs a _target_, got {node!r}")
        log.debug("instantiating %s <%s>", name, node._target_)
        objects.append(instantiate(node))
    return objects
