"""Typed settings: each kind of problem, all at once, naming key, file, override, closest key."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf

from vramkit.core.config.schema import ConfigError, check_settings, describe_type
from vramkit.core.config.source import ConfigSource, closest, override_key, source_of

CONF_DIR = Path(__file__).resolve().parents[3] / "conf"
FILE = ConfigSource("conf/data/icdar2015.yaml")
SOURCE = ConfigSource("conf/data/icdar2015.yaml", ("data=icdar2015", "data.batch_size=x"))


@dataclass(frozen=True)
class Cache:
    """A nested settings block."""

    enabled: bool = True
    """On or off."""
    max_gib: float = field(default=5.0, metadata={"gt": 0})
    """Size cap (GiB)."""


@dataclass(frozen=True, kw_only=True)
class Loader:
    """A datamodule's settings, one field per kind of annotation and limit."""

    root: Path
    """A required folder."""
    batch_size: int = field(default=8, metadata={"gt": 0})
    """A positive int."""
    workers: int = field(default=0, metadata={"ge": 0})
    """An int ≥ 0."""
    side: int = field(default=64, metadata={"gt": 0, "multiple_of": 32})
    """A positive multiple of 32."""
    fraction: float = field(default=0.5, metadata={"gt": 0, "le": 1})
    """A number in (0, 1]."""
    below_ten: float = field(default=1.0, metadata={"lt": 10})
    """A number < 10."""
    pin: bool = False
    """A flag."""
    limit: int | None = field(default=None, metadata={"ge": 1})
    """Null or an int ≥ 1."""
    mode: Literal["fast", "exact"] = "fast"
    """A choice."""
    dtype: str = field(default="float16", metadata={"choices": ("float16", "bfloat16")})
    """A choice from a runtime list."""
    val_batch: int | Literal["auto"] = field(default="auto", metadata={"gt": 0})
    """A positive int or "auto"."""
    sizes: tuple[int, int] = field(default=(1, 2), metadata={"ge": 1})
    """A pair of ints ≥ 1."""
    cache: Cache | None = None
    """Nested settings, or null."""

    def cross_field_problems(self) -> list[tuple[str, str]]:
        """A rule between two fields."""
        if self.limit is not None and self.limit < self.batch_size:
            return [("limit", f"must be ≥ batch_size ({self.batch_size}), got {self.limit}")]
        return []


def _problems(values: dict, source: ConfigSource | None = FILE) -> ConfigError:
    with pytest.raises(ConfigError) as caught:
        check_settings({"root": "data", **values}, Loader, key_prefix="data.", source=source)
    return caught.value


def _line(error: ConfigError, key: str) -> str:
    """The message line of `data.<key>`, without the key."""
    (line,) = [line for line in str(error).splitlines() if line.startswith(f"  data.{key}: ")]
    return line.removeprefix(f"  data.{key}: ")


@pytest.fixture(autouse=True)
def no_hydra_run() -> Iterator[None]:
    """Start each test outside a Hydra run, whatever an earlier test left in HydraConfig."""
    instance = HydraConfig.instance()
    saved = instance.cfg
    instance.cfg = None
    yield
    instance.cfg = saved


def test_valid_values_come_back_typed_and_normalised() -> None:
    values = {"root": "data", "fraction": 1, "sizes": [2, 3], "cache": {"max_gib": 2}}
    settings = check_settings(values, Loader, key_prefix="data.")
    assert settings.root == Path("data")
    assert settings.fraction == 1.0 and isinstance(settings.fraction, float)
    assert settings.sizes == (2, 3)
    assert settings.cache == Cache(max_gib=2.0)
    assert check_settings({"root": "d", "val_batch": 4}, Loader, key_prefix="data.").val_batch == 4


def test_a_dictconfig_is_resolved_first() -> None:
    cfg = OmegaConf.create({"workers": 3, "data": {"root": "d", "workers": "${workers}"}})
    assert check_settings(cfg.data, Loader, key_prefix="data.").workers == 3


def test_an_unknown_key_names_the_closest_valid_key_with_its_prefix() -> None:
    error = _problems({"bach_size": 4})
    assert _line(error, "bach_size") == "unknown key; did you mean data.batch_size?"
    assert error.keys == ("bach_size",)


def test_an_unknown_key_without_a_close_match_suggests_nothing() -> None:
    assert _line(_problems({"zzz": 1}), "zzz") == "unknown key"


def test_a_missing_required_key_is_named_with_its_type() -> None:
    with pytest.raises(ConfigError) as caught:
        check_settings({}, Loader, key_prefix="data.", source=SOURCE)
    assert _line(caught.value, "root") == "missing (a required path)"


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("batch_size", True, "expected int, got True (bool)"),
        ("batch_size", "8", "expected int, got '8' (str)"),
        ("batch_size", 2.0, "expected int, got 2.0 (float)"),
        ("fraction", False, "expected float, got False (bool)"),
        ("pin", "yes", "expected bool, got 'yes' (str)"),
        ("pin", 1, "expected bool, got 1 (int)"),
        ("limit", "x", "expected int or null, got 'x' (str)"),
        ("root", "", "expected path, got '' (str)"),
        ("val_batch", 8.5, 'expected int or "auto", got 8.5 (float)'),
        ("sizes", [1, 2, 3], "expected [int, int], got [1, 2, 3] (list)"),
        ("sizes", [1, "2"], "expected [int, int], got [1, '2'] (list)"),
        ("cache", 5, "expected mapping or null, got 5 (int)"),
    ],
)
def test_a_wrong_type_names_the_annotated_type(key: str, value: object, expected: str) -> None:
    assert _line(_problems({key: value}), key) == expected


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("batch_size", 0, "must be a positive int, got 0"),
        ("workers", -1, "must be ≥ 0, got -1"),
        ("side", 48, "must be a positive int, a multiple of 32, got 48"),
        ("fraction", 0, "must be in (0, 1], got 0"),
        ("fraction", 1.5, "must be in (0, 1], got 1.5"),
        ("below_ten", 10, "must be < 10, got 10"),
        ("limit", 0, "must be ≥ 1 or null, got 0"),
        ("val_batch", -2, 'must be a positive int or "auto", got -2'),
        ("val_batch", "big", "must be a positive int or \"auto\", got 'big'"),
        ("sizes", [0, 2], "every value must be ≥ 1, got [0, 2]"),
    ],
)
def test_a_value_outside_the_limits_names_them(key: str, value: object, expected: str) -> None:
    assert _line(_problems({key: value}), key) == expected


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("mode", "fats", "'fats' is not one of fast, exact; did you mean 'fast'?"),
        ("mode", "slow", "'slow' is not one of fast, exact"),
        (
            "dtype",
            "bfloat61",
            "'bfloat61' is not one of float16, bfloat16; did you mean 'bfloat16'?",
        ),
    ],
)
def test_a_value_that_is_no_choice_names_the_closest(key: str, value: str, expected: str) -> None:
    assert _line(_problems({key: value}), key) == expected


def test_nested_settings_are_checked_under_their_key() -> None:
    error = _problems({"cache": {"enabeld": True, "max_gib": 0}})
    assert error.keys == ("cache.enabeld", "cache.max_gib")
    assert _line(error, "cache.enabeld") == "unknown key; did you mean data.cache.enabled?"
    assert _line(error, "cache.max_gib") == "must be a positive number, got 0"


def test_every_problem_is_reported_at_once_under_a_title_naming_the_file() -> None:
    error = _problems({"batch_size": "x", "pin": "yes", "bach_size": 4, "mode": "slow"})
    lines = str(error).splitlines()
    assert lines[0] == "invalid data settings (conf/data/icdar2015.yaml):"
    assert error.keys == ("bach_size", "batch_size", "pin", "mode")
    assert len(lines) == 1 + len(error.keys)


def test_the_override_that_set_a_key_is_named() -> None:
    error = _problems({"batch_size": "x", "pin": "yes"}, SOURCE)
    assert _line(error, "batch_size") == (
        "expected int, got 'x' (str) (set by command-line override 'data.batch_size=x')"
    )
    assert _line(error, "pin") == "expected bool, got 'yes' (str)"


def test_cross_field_rules_run_once_the_fields_are_right() -> None:
    error = _problems({"batch_size": 8, "limit": 4})
    assert _line(error, "limit") == "must be ≥ batch_size (8), got 4"
    # A field problem first: the rule would read a value of the wrong type, so it waits.
    assert _problems({"batch_size": "8", "limit": 4}).keys == ("batch_size",)


def test_a_title_replaces_the_default_and_no_source_names_no_file() -> None:
    with pytest.raises(ConfigError, match=r"^hardware profile 'x' is invalid:\n  hw\.pin: "):
        check_settings(
            {"root": "d", "pin": 2},
            Loader,
            key_prefix="hw.",
            title="hardware profile 'x' is invalid",
        )


def test_a_config_that_is_no_mapping_is_refused_naming_the_file() -> None:
    with pytest.raises(
        ConfigError, match=re.escape("(conf/data/icdar2015.yaml): data must be a mapping")
    ):
        check_settings([1, 2], Loader, key_prefix="data.", source=SOURCE)


@dataclass(frozen=True)
class Pair:
    """Settings with a rule of two fields."""

    low: int = field(default=0, metadata={"ge": 0})
    """Lower end."""
    high: float = 1.0
    """Upper end."""

    def cross_field_problems(self) -> list[tuple[str, str]]:
        """low <= high."""
        return [("high", f"must be ≥ low ({self.low})")] if self.high < self.low else []


def test_a_self_checking_dataclass_reports_its_rules_under_the_callers_prefix() -> None:
    with pytest.raises(ConfigError) as caught:
        check_settings({"low": 5, "high": 2}, Pair, key_prefix="data.pair.", source=SOURCE)
    assert "  data.pair.high: must be ≥ low (5)" in str(caught.value)
    assert caught.value.keys == ("high",)


def test_describe_type_reads_like_the_config() -> None:
    assert describe_type(int | Literal["auto"]) == 'int or "auto"'
    assert describe_type(float | None) == "float or null"
    assert describe_type(tuple[int, ...]) == "list of int"
    assert describe_type(list[str] | None) == "list of str or null"


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


def test_a_misspelt_limit_is_a_programming_error() -> None:
    @dataclass(frozen=True)
    class Misspelt:
        size: int = field(default=1, metadata={"gte": 1})
        """A limit check_settings does not know."""

    with pytest.raises(TypeError, match=r"Misspelt\.size: unknown limit\(s\) \['gte'\]"):
        check_settings({}, Misspelt, key_prefix="x.")
