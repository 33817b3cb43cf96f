"""The wording config errors share: types and limits in words, keys, files and overrides."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Literal

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from pydantic import Field

from vramkit.core.config.schema import allowed_values, describe_type
from vramkit.core.config.source import ConfigSource, closest, override_key, source_of

CONF_DIR = Path(__file__).resolve().parents[3] / "conf"


@pytest.fixture(autouse=True)
def no_hydra_run() -> Iterator[None]:
    """Start each test outside a Hydra run, whatever an earlier test left in HydraConfig."""
    instance = HydraConfig.instance()
    saved = instance.cfg
    instance.cfg = None
    yield
    instance.cfg = saved


def test_describe_type_reads_like_the_config() -> None:
    assert describe_type(int | Literal["auto"]) == 'int or "auto"'
    assert describe_type(float | None) == "float or null"
    assert describe_type(tuple[int, ...]) == "list of int"
    assert describe_type(list[str] | None) == "list of str or null"


def test_allowed_values_reads_the_limits_of_a_constrained_union_member() -> None:
    batch = Annotated[int, Field(gt=0)] | Literal["auto"]
    assert allowed_values(batch, {"gt": 0}) == 'a positive int or "auto"'
    assert allowed_values(float | None, {"ge": 0.0}) == "≥ 0.0 or null"


def test_override_key_closest_and_override_for() -> None:
    assert override_key("+hw.precison=16-mixed") == "hw.precison"
    assert override_key("~data.val_cache") == "data.val_cache"
    assert closest("precison", ["precision", "devices"]) == "precision"
    assert closest("zzz", ["precision"]) is None
    source = ConfigSource("f", ("data.batch_size=1", "data.batch_size=2", "+data.x=3"))
    assert source.override_for("data.batch_size") == "data.batch_size=2"
    assert source.override_for("data.x") == "+data.x=3"
    assert source.override_for("data.y") is None


def test_source_of_without_hydra_describes_the_group() -> None:
    assert source_of("data") == ConfigSource("the data config")


def test_source_of_in_a_hydra_run_names_the_chosen_file_and_the_groups_overrides() -> None:
    overrides = [
        "data=icdar2015",
        "data.batch_size=4",
        "callbacks.max_time_annealing.min_steps=0",
        "+fault.oom_train_above=2",
    ]
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            cfg = compose("train", overrides=overrides, return_hydra_config=True)
    finally:
        GlobalHydra.instance().clear()
    HydraConfig.instance().set_config(cfg)
    assert source_of("data") == ConfigSource(
        "conf/data/icdar2015.yaml", ("data=icdar2015", "data.batch_size=4")
    )
    assert source_of("callbacks", node="max_time_annealing") == ConfigSource(
        "conf/callbacks/max_time_annealing.yaml", ("callbacks.max_time_annealing.min_steps=0",)
    )
    assert source_of("fault") == ConfigSource("the fault config", ("+fault.oom_train_above=2",))
