"""A monitored metric the task never logs is refused before any work, with the closest name."""

from __future__ import annotations

from pathlib import Path

import pytest

from vramkit.core.config.monitored_metrics import check_monitored_metrics, declared_metrics
from vramkit.core.config.schema import ConfigError
from vramkit.core.run.settling import compose
from vramkit.core.run.train import train

TASKS = ("text_detection", "text_classification", "sage_distill", "arc_teacher", "hf_models")


def _compose(*overrides: str):
    try:
        return compose.compose_config("train", ("+hw=cpu", *overrides))
    finally:
        compose.forget_composition()


@pytest.mark.parametrize("task", TASKS)
def test_every_task_declares_what_it_logs_and_its_default_monitors_are_among_them(task):
    cfg = _compose(f"task={task}")
    logged = declared_metrics(cfg.model)
    assert logged is not None and cfg.optimized_metric in logged
    check_monitored_metrics(cfg)


def test_a_misspelt_optimized_metric_is_refused_with_the_closest_logged_name():
    cfg = _compose("optimized_metric=val/hmaen")
    where = r"\((conf/task/text_detection\.yaml|the task config)\)"
    with pytest.raises(ConfigError, match=rf"optimized_metric='val/hmaen' {where}") as refused:
        check_monitored_metrics(cfg)
    assert "did you mean 'val/hmean'?" in str(refused.value)


def test_a_callback_monitor_the_task_never_logs_is_refused_naming_its_file():
    cfg = _compose("callbacks.model_checkpoint.monitor=val/accuracy")
    with pytest.raises(ConfigError, match=r"callbacks.model_checkpoint.monitor='val/accuracy'"):
        check_monitored_metrics(cfg)


def test_callback_metrics_outside_the_phases_are_left_to_their_callbacks():
    cfg = _compose("callbacks.model_checkpoint.monitor=perf/samples_per_s")
    check_monitored_metrics(cfg)


def test_train_refuses_it_before_the_run_folder_exists(compose_config):
    cfg = compose_config("+hw=cpu", "debug=smoke", "optimized_metric=val/hmaen")
    with pytest.raises(ConfigError, match="never logs"):
        train(cfg)
    assert not Path(cfg.paths.output_dir, "resolved_config.yaml").exists()
