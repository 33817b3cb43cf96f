"""A refusal withdraws the run's folder claim; a diverged run keeps its folder and log."""

from __future__ import annotations

import pytest

from vramkit.core.callbacks.finite_guard import TrainingDiverged
from vramkit.core.config.schema import ConfigError
from vramkit.core.run.refusal import exit_codes
from vramkit.core.run.refusal.exit_codes import EXIT_DIVERGED, EXIT_REFUSED, refusals_as_messages


@pytest.mark.parametrize(
    ("error", "code", "withdrawn"),
    [
        (ConfigError("seed: expected int or null", ("seed",)), EXIT_REFUSED, True),
        (TrainingDiverged("training diverged: non-finite loss at step 2"), EXIT_DIVERGED, False),
    ],
)
def test_only_a_refusal_made_before_any_work_withdraws_the_folder(
    monkeypatch, capsys, error, code, withdrawn
):
    calls = []
    monkeypatch.setattr(exit_codes, "withdraw_claim", lambda: calls.append(True))
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    with pytest.raises(SystemExit) as stopped, refusals_as_messages():
        raise error
    assert stopped.value.code == code
    assert bool(calls) is withdrawn
    assert capsys.readouterr().err.strip() == f"error: {error}"
