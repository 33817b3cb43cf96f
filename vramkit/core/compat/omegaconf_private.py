"""OmegaConf's private names that vramkit reads, each behind one function.

Checked on omegaconf 2.3.1 (``pyproject.toml`` admits ``>=2.3,<2.4``, as hydra-core 1.3 does);
each function has a test in ``tests/core/compat/test_omegaconf_private.py``.
"""

from __future__ import annotations

from omegaconf import Container


def parent_of(node: Container) -> Container | None:
    """The config node that holds ``node`` (None at the root), from which its interpolations
    resolve: ``Node._get_parent()``. OmegaConf has no public way to ask it. Checked on
    omegaconf 2.3.1 (omegaconf/base.py, ``Node._get_parent``)."""
    return node._get_parent()
