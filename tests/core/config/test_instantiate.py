"""instantiate(): a settings check failing in a constructor reaches the user as itself."""

from __future__ import annotations

import pytest
from hydra.errors import InstantiationException
from omegaconf import OmegaConf

from vramkit.core.config.instantiate import instantiate
from vramkit.core.config.schema import ConfigError


def refuse(**values):
    raise ConfigError(f"invalid settings: {sorted(values)}")


def crash(**values):
    raise RuntimeError("not a settings problem")


def test_a_config_error_is_not_wrapped_but_other_errors_are():
    node = OmegaConf.create({"_target_": f"{__name__}.refuse", "bach_size": 1})
    with pytest.raises(ConfigError, match=r"invalid settings: \['bach_size'\]"):
        instantiate(node)
    with pytest.raises(InstantiationException, match="not a settings problem"):
        instantiate(OmegaConf.create({"_target_": f"{__name__}.crash"}))
