"""A user's mistake is refused before any work, in one message that names the key and its file."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from vramkit.core.config.added_keys import check_added_keys
from vramkit.core.config.schema import ConfigError
from vramkit.core.config.trainer_schema import check_trainer
from vramkit.core.run.train import refuse_mistakes

REPO = Path(__file__).resolve().parents[3]
CONF = REPO / "conf"


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("max_epochs", "abc", "trainer.max_epochs: expected int or null"),
        ("max_epochs", 2.5, "trainer.max_epochs: expected int or null"),
        ("max_epochs", -2, "trainer.max_epochs"),
        ("accumulate_grad_batches", 0, "trainer.accumulate_grad_batches"),
        ("precision", "fp16", "trainer.precision"),
        ("max_time", "12h", "expected DD:HH:MM:SS"),
        ("gradient_clip_val", -1.0, "trainer.gradient_clip_val"),
    ],
)
def test_bad_trainer_values_are_refused_naming_the_key(key, value, expected):
    trainer = OmegaConf.create({"max_epochs": 3, "precision": "${hw.precision}"})
    trainer[key] = value
    with pytest.raises(ConfigError, match=expected.replace("(", r"\(")):
        check_trainer(trainer)


def test_good_trainer_values_and_profile_interpolations_pass():
    trainer = OmegaConf.create(
        {
            "max_epochs": 3,
            "max_time": "00:12:30:00",
            "precision": "${hw.precision}",  # settled with the profile, not here
            "strategy": {"_target_": "anything"},  # left to Lightning
        }
    )
    settings = check_trainer(trainer)
    assert settings.max_epochs == 3 and settings.max_time == "00:12:30:00"


def test_a_misspelt_added_key_is_refused_with_the_key_it_resembles():
    cfg = OmegaConf.create({"ckpt_path": None, "ckpt_pth": "x", "trainer": {"max_epochs": 1}})
    with pytest.raises(ConfigError, match=r"did you mean ckpt_path\? \(write ckpt_path=x"):
        check_added_keys(cfg, ["+ckpt_pth=x"], CONF)


def test_new_keys_that_resemble_nothing_groups_and_forced_adds_pass():
    cfg = OmegaConf.create(
        {"ckpt_path": None, "ckpt_pth": "x", "trainer": {"max_epochs": 1, "strategy": "ddp"}}
    )
    check_added_keys(cfg, ["+trainer.strategy=ddp", "+hw=t4", "++ckpt_pth=x"], CONF)
    both = OmegaConf.create({"trainer": {"limit_train_batches": 2, "limit_val_batches": 2}})
    check_added_keys(both, ["+trainer.limit_train_batches=2", "+trainer.limit_val_batches=2"], CONF)


@pytest.mark.slow
def test_train_py_prints_the_refusal_alone_and_exits_2(tmp_path):
    completed = subprocess.run(
        [sys.executable, "train.py", "trainer.max_epochs=abc", f"paths.log_dir={tmp_path}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert completed.returncode == 2
    assert "Traceback" not in completed.stderr
    assert "trainer.max_epochs: expected int or null, got 'abc'" in completed.stderr
    assert "conf/trainer/default.yaml" in completed.stderr
    assert not list(tmp_path.glob("**/resolved_config.yaml")), "refused before any work"


def test_a_bad_callback_value_is_refused_with_the_other_mistakes_before_any_work(compose_config):
    cfg = compose_config("callbacks.finite_guard.on_non_finite=stpo", "+hw=cpu")
    with pytest.raises(ConfigError) as refused:
        refuse_mistakes(cfg)
    assert str(refused.value).splitlines() == [
        "invalid callbacks.finite_guard settings (conf/callbacks/finite_guard.yaml):",
        "  callbacks.finite_guard.on_non_finite: 'stpo' is not one of stop, skip_step, rollback; "
        "did you mean 'stop'? (set by command-line override "
        "'callbacks.finite_guard.on_non_finite=stpo')",
    ]


def test_a_bad_max_time_is_listed_with_the_other_trainer_mistakes():
    trainer = OmegaConf.create({"max_epochs": "abc", "max_time": "12h", "precision": 64})
    with pytest.raises(ConfigError) as refused:
        check_trainer(trainer)
    assert refused.value.keys == ("max_epochs", "max_time", "precision")
    assert "trainer.max_time: expected DD:HH:MM:SS" in str(refused.value)
    assert "trainer.precision: expected str, got 64 (int)" in str(refused.value)
