"""Pydantic settings: each kind of problem in the project's wording, naming key, file, override."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

import pytest
from omegaconf import OmegaConf
from pydantic import Field

from vramkit.core.config.component_settings import check_component_settings
from vramkit.core.config.schema import ConfigError
from vramkit.core.config.settings import Settings
from vramkit.core.config.source import ConfigSource

SOURCE = ConfigSource("conf/data/x.yaml", ("data=x", "data.batch_size=-1"))


class Cache(Settings):
    """A nested settings block."""

    enabled: bool = True
    """On or off."""
    max_gib: float = Field(5.0, gt=0)
    """Size cap (GiB)."""


class Loader(Settings):
    """One field per kind of annotation and limit."""

    root: Path
    """A required folder."""
    batch_size: int = Field(8, gt=0)
    """A positive int."""
    side: int = Field(64, gt=0, multiple_of=32)
    """A positive multiple of 32."""
    fraction: float = Field(0.5, gt=0, le=1)
    """A number in (0, 1]."""
    limit: int | None = Field(None, ge=1)
    """Null or an int ≥ 1."""
    mode: Literal["fast", "exact"] = "fast"
    """A choice."""
    val_batch: Annotated[int, Field(gt=0)] | Literal["auto"] = "auto"
    """A positive int or "auto" (the limit on the int alone: "auto" has no order)."""
    sizes: tuple[Annotated[int, Field(ge=1)], ...] = (1,)
    """Ints ≥ 1."""
    cache: Cache = Cache()
    """A nested block."""

    def cross_field_problems(self) -> list[tuple[str, str]]:
        if self.limit is not None and self.limit > self.batch_size:
            return [("limit", f"must be ≤ batch_size ({self.batch_size}), got {self.limit}")]
        return []


def _problem(values: dict, key: str) -> str:
    with pytest.raises(ConfigError) as refused:
        Loader.from_config({"root": "d", **values}, key_prefix="data.", source=SOURCE)
    lines = str(refused.value).splitlines()
    assert lines[0] == "invalid data settings (conf/data/x.yaml):"
    return next(line for line in lines[1:] if line.startswith(f"  data.{key}:"))


@pytest.mark.parametrize(
    ("values", "key", "expected"),
    [
        ({"bach_size": 3}, "bach_size", "unknown key; did you mean data.batch_size?"),
        ({"mode": "fats"}, "mode", "'fats' is not one of fast, exact; did you mean 'fast'?"),
        ({"fraction": "lots"}, "fraction", "expected float, got 'lots' (str)"),
        ({"side": True}, "side", "expected int, got True (bool)"),
        ({"side": "3"}, "side", "expected int, got '3' (str)"),
        ({"side": 100}, "side", "must be a positive int, a multiple of 32, got 100"),
        ({"fraction": 1.5}, "fraction", "must be in (0, 1], got 1.5"),
        ({"limit": 0}, "limit", "must be ≥ 1 or null, got 0"),
        ({"val_batch": "aut"}, "val_batch", "must be a positive int or \"auto\", got 'aut'"),
        ({"sizes": [1, 0]}, "sizes", "every value must be ≥ 1, got [1, 0]"),
        (
            {"cache": {"enabeld": 1}},
            "cache.enabeld",
            "unknown key; did you mean data.cache.enabled?",
        ),
        ({"cache": {"max_gib": -1}}, "cache.max_gib", "must be a positive number, got -1"),
        ({"limit": 9}, "limit", "must be ≤ batch_size (8), got 9"),
    ],
)
def test_each_problem_names_the_key_and_what_is_allowed(values, key, expected) -> None:
    assert _problem(values, key) == f"  data.{key}: {expected}"


def test_the_override_that_set_a_key_and_every_problem_at_once() -> None:
    with pytest.raises(ConfigError) as refused:
        Loader.from_config({"batch_size": -1, "mode": "x"}, key_prefix="data.", source=SOURCE)
    assert str(refused.value).splitlines()[1:] == [
        "  data.root: missing (a required path)",
        "  data.batch_size: must be a positive int, got -1 "
        "(set by command-line override 'data.batch_size=-1')",
        "  data.mode: 'x' is not one of fast, exact",
    ]
    assert refused.value.keys == ("root", "batch_size", "mode")


def test_config_values_take_the_annotated_form_and_docs_come_from_docstrings() -> None:
    config = OmegaConf.create(
        {"root": "d", "sizes": [2, 3], "fraction": 1, "cache": {}, "val_batch": "auto"}
    )
    settings = Loader.from_config(config, key_prefix="data.")
    assert settings.root == Path("d") and settings.sizes == (2, 3) and settings.fraction == 1.0
    assert settings.val_batch == "auto"
    assert Loader.from_config({"root": "d", "val_batch": 4}, key_prefix="data.").val_batch == 4
    assert Loader.model_fields["side"].description == "A positive multiple of 32."
    with pytest.raises(ValueError, match="frozen"):
        settings.batch_size = 3  # type: ignore[misc]


def test_a_config_that_is_no_mapping_is_refused_naming_the_file() -> None:
    with pytest.raises(ConfigError) as refused:
        Loader.from_config([1, 2], key_prefix="data.", source=SOURCE)  # type: ignore[arg-type]
    assert str(refused.value) == (
        "invalid data settings (conf/data/x.yaml): "
        "data must be a mapping of keys, got [1, 2] (list)"
    )


def test_a_callback_setting_is_refused_early_and_interpolations_are_left_alone() -> None:
    target = "vramkit.core.callbacks.checkpoints.checkpoint_retention.CheckpointRetention"
    cfg = OmegaConf.create(
        {
            "paths": {"output_dir": "/nowhere"},
            "callbacks": {
                "checkpoint_retention": {
                    "_target_": target,
                    "dirpath": "${paths.output_dir}/checkpoints",
                    "keep_lst": 3,
                    "budget_gib": "${oc.env:NO_SUCH_VARIABLE_ANYWHERE}",
                    "report_path": "???",
                },
                "other": {"_target_": "builtins.dict", "anything": 1},
            },
        }
    )
    with pytest.raises(ConfigError) as refused:
        check_component_settings(cfg)
    assert str(refused.value).splitlines()[1:] == [
        "  callbacks.checkpoint_retention.keep_lst: unknown key; "
        "did you mean callbacks.checkpoint_retention.keep_last?"
    ]
    del cfg.callbacks.checkpoint_retention.keep_lst
    check_component_settings(cfg)


def test_from_node_names_the_node_s_keys_file_and_override(compose_config) -> None:
    compose_config("callbacks.max_time_annealing.min_steps=0", "data.batch_size=-1")
    with pytest.raises(ConfigError) as refused:
        Loader.from_node({"root": "d", "side": 100}, node="callbacks.max_time_annealing")
    assert str(refused.value).splitlines() == [
        "invalid callbacks.max_time_annealing settings (conf/callbacks/max_time_annealing.yaml):",
        "  callbacks.max_time_annealing.side: must be a positive int, a multiple of 32, got 100",
    ]
    with pytest.raises(ConfigError) as refused:
        Loader.from_node({"root": "d", "batch_size": -1}, node="data")
    assert "(set by command-line override 'data.batch_size=-1')" in str(refused.value)
