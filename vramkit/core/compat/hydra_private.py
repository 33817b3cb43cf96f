"""Hydra's private names that vramkit reads, each behind one function.

Checked on hydra-core 1.3.8 (``pyproject.toml`` admits ``>=1.3.8,<1.4``); each function has a
test in ``tests/core/compat/test_hydra_private.py``.
"""

from __future__ import annotations

from typing import Any

from hydra.core.utils import JobReturn


def job_outcome(job_return: JobReturn) -> Any:
    """What a multirun job returned, or the exception it failed with: ``JobReturn._return_value``.

    The public ``JobReturn.return_value`` re-raises a failed job's exception (after writing to
    stderr), which a summary of every job must not do. Checked on hydra-core 1.3.8
    (hydra/core/utils.py, ``JobReturn``)."""
    return job_return._return_value
