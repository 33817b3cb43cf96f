"""A key Hydra refuses on the command line is one line of vramkit's, exit status 2, with the
right fix first: the existing key it resembles with the value, ``+key=`` only for a key that is
genuinely new and read."""

from __future__ import annotations

import sys

import pytest

from vramkit.core.run.refusal.held_stderr import release_stderr
from vramkit.core.run.refusal.override_typos import did_you_mean_on_refusal, override_refusal

TYPO = ["trainer.max_epoch=3"]
HYDRAS_LINES = (
    "Could not override 'trainer.max_epoch'.\n"
    "To append to your config use +trainer.max_epoch=3\n"
    "Key 'max_epoch' is not in struct\n"
    "    full_key: trainer.max_epoch\n"
    "    object_type=dict\n\n"
    "Set the environment variable HYDRA_FULL_ERROR=1 for a complete stack trace.\n"
)


@pytest.mark.parametrize(
    ("overrides", "refusal"),
    [
        (
            ["trainer.max_epoch=3"],
            "trainer.max_epoch=3: trainer (conf/trainer/default.yaml) has no key 'max_epoch'; "
            "did you mean trainer.max_epochs=3?",
        ),
        (
            ["model.optimzer.lr=0.1", "trainer.max_epochs=2"],
            "model.optimzer.lr=0.1: model (conf/model/dbnet_tiny.yaml) has no key 'optimzer'; "
            "did you mean model.optimizer.lr=0.1?",
        ),
        (
            ["+hw=cpu", "hw.batch_sise=8"],
            "hw.batch_sise=8: hw (conf/hw/cpu.yaml) has no key 'batch_sise'; "
            "did you mean hw.batch_size=8?",
        ),
        (
            ["trainer.zzzz=1"],
            "trainer.zzzz=1: trainer (conf/trainer/default.yaml) has no key 'zzzz'",
        ),
        (  # a Trainer argument the file does not set: new there, and Lightning reads it
            ["trainer.detect_anomaly=true"],
            "trainer.detect_anomaly=true: trainer (conf/trainer/default.yaml) has no key "
            "'detect_anomaly'; it is a new key there: +trainer.detect_anomaly=true",
        ),
        (  # a Trainer argument that resembles a key the file sets: the argument it is
            ["trainer.max_steps=1"],
            "trainer.max_steps=1: trainer (conf/trainer/default.yaml) has no key 'max_steps'; "
            "it is a new key there: +trainer.max_steps=1",
        ),
        (
            ["+trainer.max_epochs=3"],
            "+trainer.max_epochs=3: trainer.max_epochs is already in the config "
            "(conf/trainer/default.yaml); set it without the plus: trainer.max_epochs=3",
        ),
    ],
)
def test_a_refused_key_gets_its_fix_with_the_value(overrides, refusal):
    assert override_refusal("train", overrides) == refusal


def test_a_profile_key_without_a_profile_is_added_with_a_plus():
    refusal = override_refusal("train", ["hw.memory_gib=0.63"])
    assert refusal.startswith("hw.memory_gib=0.63: no hardware profile was chosen")
    assert "+hw.memory_gib=0.63" in refusal and "+hw=t4 hw.memory_gib=0.63" in refusal
    assert override_refusal("train", ["hw.memory_gb=0.63"]) == (
        "hw.memory_gb=0.63: a hardware profile has no key 'memory_gb'; "
        "did you mean +hw.memory_gib=0.63?"
    )


def test_the_first_of_two_refused_keys_is_named():
    refusal = override_refusal("train", ["trainer.max_epoch=3", "trainer.limit_val_batches=1"])
    assert refusal.endswith("did you mean trainer.max_epochs=3?")


def test_a_command_line_hydra_accepts_is_not_refused():
    assert override_refusal("train", ["trainer.max_epochs=2", "+hw=cpu"]) is None


def test_hydras_lines_give_way_to_one_line_and_exit_status_2(capsys):
    with pytest.raises(SystemExit) as stop, did_you_mean_on_refusal("train", TYPO):
        sys.stderr.write(HYDRAS_LINES)
        raise SystemExit(1)
    assert stop.value.code == 2
    assert capsys.readouterr().err == (
        "error: trainer.max_epoch=3: trainer (conf/trainer/default.yaml) has no key "
        "'max_epoch'; did you mean trainer.max_epochs=3?\n"
    )


def test_a_refusal_it_cannot_explain_keeps_hydras_lines(capsys):
    with pytest.raises(SystemExit) as stop, did_you_mean_on_refusal("train", ["model=dbnet_tny"]):
        sys.stderr.write("Could not find 'model/dbnet_tny'\n")
        raise SystemExit(1)
    assert stop.value.code == 1
    assert capsys.readouterr().err == "Could not find 'model/dbnet_tny'\n"


def test_once_the_run_started_stderr_writes_through_and_its_exits_stand(capsys):
    with pytest.raises(SystemExit) as stop, did_you_mean_on_refusal("train", TYPO):
        sys.stderr.write("held\n")
        release_stderr()  # as refusals_as_messages does when the task function starts
        assert capsys.readouterr().err == "held\n"
        sys.stderr.write("live\n")
        assert capsys.readouterr().err == "live\n"
        raise SystemExit(1)
    assert stop.value.code == 1
    assert capsys.readouterr().err == ""
