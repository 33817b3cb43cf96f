"""The trainer's defaults live once, in `TrainerSettings`: conf/trainer says ``???`` for them and
the composed trainer holds the class's values."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf
from pydantic import TypeAdapter
from pydantic_core import PydanticUndefined

from vramkit.core.config.component_settings import LIBRARY_SETTINGS
from vramkit.core.config.settings_schemas import uses_schema
from vramkit.core.config.trainer_schema import TrainerSettings

CONF = Path(__file__).resolve().parents[2] / "conf"
TRAINER_FILES = sorted((CONF / "trainer").glob("*.yaml"))
SETTINGS_PATH = LIBRARY_SETTINGS["lightning.pytorch.Trainer"]


def _at_default(key: str, value: object) -> bool:
    field = TrainerSettings.model_fields[key]
    default = field.get_default(call_default_factory=True)
    if default is PydanticUndefined or value == "???" or "${" in str(value):
        return False
    return TypeAdapter(field.annotation).validate_json(json.dumps(value)) == default


@pytest.mark.parametrize("file", TRAINER_FILES, ids=lambda f: f.name)
def test_no_trainer_file_writes_a_default_of_the_settings_class(file):
    values = yaml.safe_load(file.read_text()) or {}
    repeated = [
        f"{key}: {value!r}"
        for key, value in values.items()
        if key in TrainerSettings.model_fields and _at_default(key, value)
    ]
    assert repeated == [], f"{file.name} repeats TrainerSettings' defaults; write ??? instead"


def test_the_default_trainer_composes_the_class_defaults_under_itself():
    file = CONF / "trainer" / "default.yaml"
    content = yaml.safe_load(file.read_text())
    assert uses_schema(file, content, CONF)
    asked = [key for key, value in content.items() if value == "???"]
    assert asked and set(asked) <= set(TrainerSettings.model_fields)
    assert f"{TrainerSettings.__module__}.{TrainerSettings.__qualname__}" == SETTINGS_PATH


def test_the_composed_trainer_holds_the_settings_defaults(compose_config):
    cfg = compose_config("+hw=cpu")  # the default task sets max_epochs and max_time
    raw = OmegaConf.to_container(cfg.trainer, resolve=False)
    defaults = TrainerSettings()
    for key in ("log_every_n_steps", "num_sanity_val_steps", "check_val_every_n_epoch"):
        assert raw[key] == f"${{settings_default:{SETTINGS_PATH},{key}}}"
        assert cfg.trainer[key] == getattr(defaults, key)
    assert cfg.trainer.deterministic is False and cfg.trainer.enable_model_summary is False
    assert cfg.trainer.gradient_clip_val is None
    assert cfg.trainer.max_epochs == 8  # the task's value over the class's default
