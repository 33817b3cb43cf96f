"""A key at its default says ??? in the YAML; the composed config holds the class's default."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf
from omegaconf.errors import MissingMandatoryValue

from vramkit.core.callbacks.finite_guard import FiniteGuardSettings
from vramkit.core.config.settings_schemas import (
    OWN_COMPONENTS,
    class_default,
    default_values,
    register_settings_schemas,
    with_class_defaults,
)

GUARD = """\
{defaults}
guard:
  _target_: vramkit.core.callbacks.finite_guard.FiniteGuard
  on_non_finite: ???  # what a non-finite value does
  max_non_finite_in_a_row: 7  # a value of this config
"""


def _compose(conf: Path, overrides: list[str]):
    register_settings_schemas(conf)
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
        return compose("main", overrides=overrides)


def _tree(tmp_path: Path, defaults: str) -> Path:
    conf = tmp_path / "conf"
    (conf / "callbacks").mkdir(parents=True)
    (conf / "main.yaml").write_text("defaults:\n  - callbacks: guard\n  - _self_\n")
    (conf / "callbacks" / "guard.yaml").write_text(GUARD.format(defaults=defaults))
    return conf


WITH_SCHEMA = "defaults:\n  - _self_\n  - /schema/callbacks/guard@_here_\n"


def test_question_marks_take_the_class_default_and_values_stay(tmp_path: Path) -> None:
    cfg = _compose(_tree(tmp_path, WITH_SCHEMA), [])
    guard = cfg.callbacks.guard
    assert guard.on_non_finite == FiniteGuardSettings.model_fields["on_non_finite"].default
    assert guard.max_non_finite_in_a_row == 7
    assert list(guard) == ["_target_", "on_non_finite", "max_non_finite_in_a_row"]  # file order
    assert OmegaConf.to_container(guard)["on_non_finite"] == (
        "${settings_default:vramkit.core.callbacks.finite_guard.FiniteGuard,on_non_finite}"
    )


def test_a_list_default_resolves_in_place(tmp_path: Path) -> None:
    conf = _tree(tmp_path, WITH_SCHEMA)
    (conf / "callbacks" / "guard.yaml").write_text(
        WITH_SCHEMA + "guard:\n"
        "  _target_: vramkit.core.callbacks.checkpoints.resume_checkpoint.ResumeCheckpoint\n"
        "  stop_signals: ???  # signals\n"
    )
    cfg = _compose(conf, [])
    OmegaConf.resolve(cfg)  # what --cfg job --resolve does
    assert OmegaConf.to_container(cfg.callbacks.guard.stop_signals) == [
        "SIGTERM",
        "SIGINT",
        "SIGUSR1",
    ]


def test_an_override_replaces_the_class_default(tmp_path: Path) -> None:
    cfg = _compose(_tree(tmp_path, WITH_SCHEMA), ["callbacks.guard.on_non_finite=rollback"])
    assert cfg.callbacks.guard.on_non_finite == "rollback"


def test_without_its_schema_a_question_mark_is_missing(tmp_path: Path) -> None:
    cfg = _compose(_tree(tmp_path, ""), [])
    with pytest.raises(MissingMandatoryValue):
        _ = cfg.callbacks.guard.on_non_finite


PROBE = """
import sys
from vramkit.core.run.settling.compose import compose_config

def imported():
    return [m in sys.modules for m in ("lightning", "vramkit.tasks.text_detection.data.datamodule")]

cfg = compose_config("train", ["+hw=cpu"], output_dir="unused")
print(imported())
print(cfg.callbacks.finite_guard.on_non_finite, imported())
"""


def test_composing_imports_no_component_and_reading_a_default_imports_its_own() -> None:
    root = Path(__file__).resolve().parents[3]
    env = {**os.environ, "PYTHONPATH": str(root)}
    run = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, cwd=root
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.splitlines() == ["[False, False]", "stop [True, False]"]


def test_defaults_are_written_as_a_config_holds_them() -> None:
    from vramkit.core.callbacks.checkpoints.resume_checkpoint import ResumeCheckpointSettings

    values = default_values(ResumeCheckpointSettings)
    assert values["stop_signals"] == ["SIGTERM", "SIGINT", "SIGUSR1"]  # a tuple as a list
    assert OmegaConf.create(values).min_interval_s == 60.0


@pytest.fixture(autouse=True)
def _forget_hydra():
    yield
    GlobalHydra.instance().clear()


def test_the_early_check_judges_class_defaults_too(compose_config) -> None:
    from vramkit.core.config.component_settings import check_component_settings
    from vramkit.core.config.schema import ConfigError

    cfg = compose_config("+hw=cpu", "data=icdar2015")  # its folders left at the class's null
    with pytest.raises(ConfigError) as refused:
        check_component_settings(cfg)
    assert str(refused.value).splitlines() == [
        "invalid data settings (conf/data/icdar2015.yaml):",
        "  data.train_dir: missing: a folder (images/, gt/), or set data.synthetic",
        "  data.val_dir: missing: a folder (images/, gt/), or set data.synthetic",
    ]


def test_with_class_defaults_reads_class_defaults_only() -> None:
    guard = "vramkit.core.callbacks.finite_guard.FiniteGuard"
    record = {
        "guard": {
            "on_non_finite": f"${{settings_default:{guard},on_non_finite}}",
            "unknown": f"${{settings_default:{guard},no_such_key}}",
            "foreign": "${settings_default:os.path,sep}",
        },
        # a resolver that reads the disk: a record's strings are data, never resolved
        "folder": "${run_folder:/tmp/runs,${ckpt_path}}",
        "batch": ["${hw.batch_size}", 3],
    }
    expected_guard = {
        "on_non_finite": FiniteGuardSettings().on_non_finite,
        "unknown": record["guard"]["unknown"],  # no such default: as written, not an error
        "foreign": record["guard"]["foreign"],  # not vramkit's: a record names no module to import
    }
    assert with_class_defaults(record, OWN_COMPONENTS) == {**record, "guard": expected_guard}


def test_a_run_records_class_defaults_as_values(compose_config) -> None:
    # resolved_config.yaml (train.py's _record_config) and the loggers' hyperparameters are the
    # config resolved: what vramkit compare and vramkit report read, never the interpolation
    cfg = compose_config("+hw=cpu", "debug=smoke")
    recorded = OmegaConf.to_yaml(cfg, resolve=True)
    assert "settings_default" in OmegaConf.to_yaml(cfg) and "settings_default" not in recorded
    data = OmegaConf.create(recorded).data
    assert (data.strict, data.persistent_workers, data.train_dir) == (False, True, None)


def test_a_component_without_a_settings_class_has_its_defaults_in_its_signature() -> None:
    assert class_default("textwrap.TextWrapper", "width") == 70
    assert class_default("json.dumps", "indent") is None
    for target, key in (("textwrap.TextWrapper", "no_such_key"), ("os.path", "sep")):
        with pytest.raises(ValueError, match=key):
            class_default(target, key)
