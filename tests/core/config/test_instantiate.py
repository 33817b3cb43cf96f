"""instantiate(): a settings error raised by a constructor reaches the caller unwrapped."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from omegaconf import OmegaConf

from vramkit.core.config.instantiate import instantiate
from vramkit.core.config.schema import ConfigError, check_settings


@dataclass(frozen=True, kw_only=True)
class _Settings:
    rank: int = 4


class Checked:
    def __init__(self, **values: int) -> None:
        check_settings(values, _Settings, key_prefix="thing.")


def test_a_constructors_config_error_is_raised_as_itself():
    node = OmegaConf.create({"_target_": f"{__name__}.Checked", "rnak": 8})
    with pytest.raises(ConfigError, match=r"thing\.rnak: unknown key; did you mean thing\.rank\?"):
        instantiate(node)
    assert isinstance(instantiate(OmegaConf.create({"_target_": f"{__name__}.Checked"})), Checked)
