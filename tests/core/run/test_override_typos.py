"""A key Hydra refuses on the command line gets the existing key it resembles, with its file."""

from __future__ import annotations

import pytest

from vramkit.core.run.override_typos import did_you_mean_on_refusal, unknown_key_hint


def test_a_misspelt_model_key_names_the_key_it_resembles_and_the_file():
    hint = unknown_key_hint("train", ["model.optimzer.lr=0.1", "trainer.max_epochs=2"])
    assert hint == (
        "hint: model (conf/model/dbnet_tiny.yaml) has no key 'optimzer'; did you mean "
        "model.optimizer?"
    )


def test_a_misspelt_trainer_key_and_a_key_like_nothing():
    assert unknown_key_hint("train", ["trainer.max_epoch=3"]).endswith(
        "did you mean trainer.max_epochs?"
    )
    assert unknown_key_hint("train", ["trainer.zzzz=1"]) == (
        "hint: trainer (conf/trainer/default.yaml) has no key 'zzzz'"
    )


def test_a_profile_key_without_a_profile_says_how_to_give_it():
    hint = unknown_key_hint("train", ["hw.batch_size=8"])
    assert "+hw.batch_size=8" in hint and "+hw=t4 hw.batch_size=8" in hint
    assert unknown_key_hint("train", ["+hw=cpu", "hw.batch_sise=8"]).endswith(
        "did you mean hw.batch_size?"
    )


def test_a_command_line_hydra_accepts_gets_no_hint():
    assert unknown_key_hint("train", ["trainer.max_epochs=2", "+hw=cpu"]) is None


def test_the_hint_follows_hydras_refusal_only(capsys):
    with pytest.raises(SystemExit), did_you_mean_on_refusal("train", ["trainer.max_epoch=3"]):
        raise SystemExit(1)
    assert "did you mean trainer.max_epochs?" in capsys.readouterr().err
    with pytest.raises(SystemExit), did_you_mean_on_refusal("train", ["trainer.max_epoch=3"]):
        raise SystemExit(0)
    assert capsys.readouterr().err == ""
