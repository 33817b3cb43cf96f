"""vramkit/core/compat/hydra_private.py on the installed Hydra."""

from __future__ import annotations

from hydra.core.utils import JobReturn, JobStatus

from vramkit.core.compat import hydra_private


def test_job_outcome_is_the_return_value_or_the_error_without_raising():
    done = JobReturn(status=JobStatus.COMPLETED)
    done.return_value = 0.75
    assert hydra_private.job_outcome(done) == 0.75
    error = ValueError("diverged")
    failed = JobReturn(status=JobStatus.FAILED)
    failed.return_value = error
    assert hydra_private.job_outcome(failed) is error
