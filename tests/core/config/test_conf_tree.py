"""Components find their config node in the config tree instead of naming it."""

from __future__ import annotations

from pathlib import Path

import pytest

from vramkit.core.callbacks.checkpoints.resume_checkpoint import ResumeCheckpoint
from vramkit.core.callbacks.finite_guard import FiniteGuard
from vramkit.core.config.conf_tree import conf_nodes, node_of, package_of
from vramkit.core.config.schema import ConfigError


def test_a_component_s_node_is_where_the_tree_names_its_class() -> None:
    assert node_of(ResumeCheckpoint) == "callbacks.last_checkpoint"
    assert node_of(FiniteGuard) == "callbacks.finite_guard"


def test_a_subclass_takes_the_node_of_its_configured_base() -> None:
    class StricterGuard(FiniteGuard):
        pass

    assert node_of(StricterGuard) == "callbacks.finite_guard"


def test_a_class_no_config_names_has_no_node() -> None:
    class Unconfigured:
        pass

    assert node_of(Unconfigured) is None


def test_a_package_header_moves_the_node(tmp_path: Path) -> None:
    (tmp_path / "task").mkdir()
    (tmp_path / "callbacks").mkdir()
    (tmp_path / "task" / "t.yaml").write_text("# @package _global_\ndata:\n  _target_: a.B\n")
    (tmp_path / "callbacks" / "c.yaml").write_text("c:\n  _target_: a.C\n")
    assert package_of(tmp_path / "task" / "t.yaml", tmp_path) == ""
    assert [(n.key, n.target) for n in conf_nodes(tmp_path)] == [
        ("callbacks.c", "a.C"),
        ("data", "a.B"),
    ]


def test_a_bad_key_of_a_component_built_in_code_names_its_derived_node() -> None:
    with pytest.raises(ConfigError) as refused:
        ResumeCheckpoint(every_n_train_step=3)
    message = str(refused.value)
    assert "callbacks.last_checkpoint.every_n_train_step: unknown key" in message
    assert "did you mean callbacks.last_checkpoint.every_n_train_steps?" in message
