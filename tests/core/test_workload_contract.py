"""The workload contract: a new workload outside vramkit/tasks/ (tests/minimal_workload/) trains,
plans and survives an injected OOM through it alone; one that breaks it is refused by name."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
from omegaconf import OmegaConf, open_dict

from vramkit.core.config.schema import ConfigError
from vramkit.core.hardware.profile import HardwareProfile
from vramkit.core.planner import plan_task
from vramkit.core.run.settling.plan_request_from_config import plan_request
from vramkit.core.run.settling.resolve_hardware import requested_profile
from vramkit.core.run.train import train
from vramkit.core.workload import GUIDE, check_workload

MINIMAL_CONF = Path(__file__).resolve().parents[1] / "minimal_workload" / "conf"
MINIMAL = (
    f"hydra.searchpath=[file://{MINIMAL_CONF}]",
    "task=minimal_regression",
    "+hw=cpu",
    "data.num_workers=0",  # no loader process to start: the test stays about a second long
)


def test_the_minimal_workload_trains_through_an_injected_oom(compose_config):
    cfg = compose_config(*MINIMAL, "logger=csv", "+fault.oom_train_above=2")
    val_loss = train(cfg)
    assert val_loss is not None and val_loss >= 0
    (metrics_csv,) = Path(cfg.paths.output_dir).glob("csv/version_*/metrics.csv")
    with metrics_csv.open() as handle:
        rows = list(csv.DictReader(handle))
    last = {name: value for row in rows for name, value in row.items() if value}
    # batches of 4 (batch_size_defaults.train) redone as 2 micro-batches of 2, kept for the run
    assert float(last["oom/train_recoveries"]) == 1
    assert float(last["oom/train_micro_batch"]) == 2
    assert float(last["oom/train_accumulation"]) == 2
    assert float(last["epoch"]) == 1  # both epochs ran: 16 points / 4 = 4 steps each
    assert (Path(cfg.paths.output_dir) / "checkpoints" / "last.ckpt").is_file()


def test_the_minimal_workload_is_planned_for_a_gpu(compose_config):
    cfg = compose_config(*MINIMAL)
    t4: HardwareProfile = requested_profile(
        compose_config(*MINIMAL[:2], "+hw=t4"), conf_dir=Path(cfg.paths.conf_dir)
    ).profile
    plan = plan_task(plan_request(cfg, t4, batch_sizes=(4, 8)))
    assert plan.fits
    assert (plan.train.batch_size, plan.val.batch_size) == (4, 8)
    assert 0 < plan.train.peak < plan.budget_bytes


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        (("~batch_size_defaults.val",), "batch_size_defaults.val is missing"),
        (("~optimized_metric",), "optimized_metric is missing"),
        (("monitor_mode=best",), "monitor_mode='best'"),
        (
            ("model._target_=tests.core.callbacks.tiny_regression.TinyRegression",),
            "TinyRegression (conf/model/minimal_regression.yaml) is no OOMResilientModule",
        ),
        (
            ("data._target_=lightning.LightningDataModule",),
            "does not define train_dataloader",
        ),
    ],
)
def test_a_workload_missing_a_piece_is_refused_naming_it(compose_config, overrides, named):
    cfg = compose_config(*MINIMAL, *overrides)
    with pytest.raises(ConfigError) as refused:
        check_workload(cfg)
    message = str(refused.value)
    assert named in message
    assert GUIDE in message and "\n" not in message


def test_a_data_node_without_the_profiles_batch_size_is_refused(compose_config):
    cfg = compose_config(*MINIMAL)
    with open_dict(cfg):
        del cfg.data.val_batch_size  # Hydra cannot delete an interpolated key by override
    with pytest.raises(ConfigError, match=r"data.val_batch_size is missing \(conf/data/minimal"):
        check_workload(cfg)


def test_the_check_resolves_no_value(compose_config):
    # reading data.batch_size would run the memory planner on a GPU profile (4 s for DBNet on t4)
    reads: list[str] = []
    OmegaConf.register_new_resolver("counted_read", lambda key: reads.append(key) or 4)
    try:
        cfg = compose_config(
            *MINIMAL,
            "data.batch_size=${counted_read:batch_size}",
            "data.val_batch_size=${counted_read:val_batch_size}",
            "optimized_metric=${counted_read:optimized_metric}",
        )
        check_workload(cfg)
    finally:
        OmegaConf.clear_resolver("counted_read")
    assert reads == []


def test_a_misspelt_task_key_is_refused_with_the_closest_name(compose_config):
    cfg = compose_config(*MINIMAL, "~batch_size_defaults", "+batch_size_default={train:4,val:8}")
    with pytest.raises(ConfigError, match=r"did you mean batch_size_default\.train\?"):
        check_workload(cfg)


def test_the_shipped_tasks_keep_the_contract(compose_config):
    for task in ("text_detection", "sage_distill", "arc_teacher", "text_classification"):
        check_workload(compose_config(f"task={task}", "+hw=cpu"))


def test_train_refuses_a_broken_workload_before_any_work(compose_config):
    cfg = compose_config(*MINIMAL, "~monitor_mode")
    with pytest.raises(ConfigError, match="monitor_mode is missing"):
        train(cfg)
    assert not Path(cfg.paths.output_dir).exists()  # no run folder, no logger, no data
