"""vramkit/core/compat/omegaconf_private.py on the installed OmegaConf."""

from __future__ import annotations

from omegaconf import OmegaConf

from vramkit.core.compat import omegaconf_private


def test_parent_of_a_node_is_the_node_holding_it():
    root = OmegaConf.create({"model": {"lr": "${trainer.lr}"}, "trainer": {"lr": 0.1}})
    assert omegaconf_private.parent_of(root.model) is root
    assert omegaconf_private.parent_of(root) is None
    copy = OmegaConf.create({"lr": "${trainer.lr}"}, parent=omegaconf_private.parent_of(root.model))
    assert copy.lr == 0.1  # interpolations resolve from the parent, which upgrade_targets needs
