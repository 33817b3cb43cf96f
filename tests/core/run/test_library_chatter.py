"""Other libraries' chatter is hidden by exact line, and verbose=true shows it again."""

from __future__ import annotations

import logging
import os
import warnings

import pytest

from vramkit.core.config.schema import ConfigError
from vramkit.core.run.library_chatter import (
    OutputSettings,
    hide_library_chatter,
    output_settings,
)

RANK_ZERO = logging.getLogger("lightning.pytorch.utilities.rank_zero")


@pytest.fixture
def quiet_then_verbose(monkeypatch):
    """Hide the chatter for one test (in a copy of the environment), then show it again."""
    monkeypatch.setattr(os, "environ", dict(os.environ))
    monkeypatch.delitem(os.environ, "WANDB_QUIET", raising=False)
    hide_library_chatter(OutputSettings())
    yield
    hide_library_chatter(OutputSettings(verbose=True))


def _shown(caplog, *messages: str) -> list[str]:
    caplog.clear()
    with caplog.at_level(logging.INFO, logger=RANK_ZERO.name):
        for message in messages:
            RANK_ZERO.info(message)
    return [record.getMessage() for record in caplog.records]


def test_listed_lines_are_hidden_and_others_still_show(quiet_then_verbose, caplog):
    shown = _shown(
        caplog, "GPU available: False, used: False", "Restoring states from the checkpoint"
    )
    assert shown == ["Restoring states from the checkpoint"]
    assert os.environ["WANDB_QUIET"] == "true"  # no history and summary block from WandB


def test_verbose_shows_every_line_again(quiet_then_verbose, caplog):
    hide_library_chatter(OutputSettings(verbose=True))
    assert _shown(caplog, "GPU available: False, used: False") == [
        "GPU available: False, used: False"
    ]


def test_the_leafspec_deprecation_is_hidden_and_other_future_warnings_show():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        hide_library_chatter(OutputSettings())
        for message in ("`isinstance(treespec, LeafSpec)` is deprecated", "X is deprecated"):
            warnings.warn(message, FutureWarning, stacklevel=1)
    hide_library_chatter(OutputSettings(verbose=True))
    assert [str(w.message) for w in caught] == ["X is deprecated"]


def test_a_users_own_wandb_setting_wins(monkeypatch):
    monkeypatch.setenv("WANDB_QUIET", "false")
    hide_library_chatter(OutputSettings())
    hide_library_chatter(OutputSettings(verbose=True))
    assert os.environ["WANDB_QUIET"] == "false"


def test_a_wrong_verbose_value_names_the_key_and_its_file():
    with pytest.raises(ConfigError) as error:
        output_settings("loud", config_file="conf/train.yaml")
    assert "verbose" in str(error.value) and "conf/train.yaml" in str(error.value)
    assert output_settings(None, config_file="conf/train.yaml") == OutputSettings()


def test_the_fits_planned_end_is_hidden_and_an_empty_fit_still_shows(quiet_then_verbose, caplog):
    shown = _shown(
        caplog,
        "`Trainer.fit` stopped: `max_epochs=8` reached.",
        "`Trainer.fit` stopped: `max_steps=100` reached.",
        "`Trainer.fit` stopped: No training batches.",
        "Time limit reached. Elapsed time is 0:12:36. Signaling Trainer to stop.",
    )
    assert shown == ["`Trainer.fit` stopped: No training batches."]
