"""Settle, then compose: the settlement's overrides turn the user's config into the run's."""

from __future__ import annotations

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from vramkit.core.config.schema import ConfigError
from vramkit.core.hardware.detect import DeviceInfo
from vramkit.core.run.folder.run_folder import read_run_overrides
from vramkit.core.run.settling import compose
from vramkit.core.run.settling import settle as settle_module
from vramkit.core.run.settling.compose import settled_config
from vramkit.core.run.settling.settle import override_text, settle, write_overrides

CPU_2 = DeviceInfo("cpu", "CPU", 16.0, None, count=0, cpu_count=2)
T4 = DeviceInfo("cuda", "Tesla T4", 14.57, (7, 5), count=1, cpu_count=2)


def test_a_cpu_run_settles_its_auto_batch_sizes_as_overrides(compose_config):
    cfg = compose_config("+hw=cpu", "debug=smoke", "hw.val_batch_size=3")
    settlement = settle(cfg, device=CPU_2, plan_batches=False)
    assert cfg.hw.batch_size == "auto"  # the user's config is left as composed
    train = cfg.batch_size_defaults.train
    assert settlement.overrides == (f"++hw.batch_size={train}",)  # val was given: nothing to add
    run = settled_config(settlement)
    assert (run.data.batch_size, run.data.val_batch_size) == (train, 3)
    assert settlement.run_overrides[-1] == f"++hw.batch_size={train}"
    assert f"++hw.batch_size={train}" in str(settlement) and "hardware profile cpu" in str(
        settlement
    )


def test_a_detected_profile_is_named_as_the_user_would_type_it(compose_config):
    cfg = compose_config("debug=smoke")
    settlement = settle(cfg, device=CPU_2, plan_batches=False)
    assert settlement.detected and settlement.overrides[0] == "+hw=cpu"
    assert settled_config(settlement).trainer.precision == "32-true"


def test_keys_given_without_a_profile_stay_the_users_and_the_rest_is_added(compose_config):
    cfg = compose_config("debug=smoke", "+hw.num_workers=0")
    settlement = settle(cfg, device=CPU_2, plan_batches=False)
    assert "+hw=cpu" not in settlement.overrides  # it would clash with the user's +hw.num_workers
    assert "++hw.name=cpu" in settlement.overrides
    assert not any(o.startswith("++hw.num_workers") for o in settlement.overrides)
    assert settled_config(settlement).data.num_workers == 0


def test_the_recorded_overrides_repeat_the_run_with_nothing_left_to_settle(
    compose_config, tmp_path
):
    first = settle(compose_config("debug=smoke"), device=CPU_2, plan_batches=False)
    path = write_overrides(tmp_path, first)
    assert path.read_text().splitlines() == list(first.run_overrides)

    again = settle(compose_config(*read_run_overrides(path)), device=CPU_2, plan_batches=False)
    assert again.overrides == ()  # +hw=cpu and every batch size are explicit now
    assert OmegaConf.to_container(settled_config(again), resolve=True) == OmegaConf.to_container(
        settled_config(first), resolve=True
    )


def test_a_rehearsal_settles_its_mapped_values_and_repeats_as_itself(compose_config):
    cfg = compose_config("+hw=t4", "hw.strict=false", "debug=smoke")
    first = settle(cfg, device=CPU_2, plan_batches=False)
    mapped = {"++hw.accelerator=cpu", "++hw.precision=32-true", "++hw.pin_memory=false"}
    assert mapped <= set(first.overrides)  # what the CPU runs instead of the T4's settings
    again = settle(compose_config(*first.run_overrides), device=CPU_2, plan_batches=False)
    assert again.overrides == () and again.profile == first.profile


def test_a_planned_t4_run_settles_the_planned_batch_sizes(compose_config):
    cfg = compose_config("+hw=t4", "debug=smoke")
    settlement = settle(cfg, device=T4)
    # all 16 smoke images fit in one training batch: searched, not the task's default
    assert {"++hw.batch_size=16", "++hw.val_batch_size=4"} <= set(settlement.overrides)
    run = settled_config(settlement)
    assert (run.data.batch_size, run.trainer.precision) == (16, "16-mixed")
    assert any("batch" in line for line in settlement.decisions)


def test_the_runs_applied_overrides_come_before_the_settlements(compose_config):
    # what train() hands in for a resume that applies changes (ResumeVerdict.overrides)
    cfg = compose_config("+hw=cpu", "debug=smoke")
    applied = ("++resume.changes=['model.optimizer.lr: 0.004 -> 0.01']",)
    settlement = settle(cfg, device=CPU_2, plan_batches=False, applied=applied)
    assert list(cfg.resume.changes) == []  # the user's config is left as composed
    assert settlement.run_overrides == (
        *settlement.user_overrides,
        *applied,
        *settlement.overrides,
    )
    assert list(settled_config(settlement).resume.changes) == ["model.optimizer.lr: 0.004 -> 0.01"]


def test_settling_composes_the_runs_config_once(compose_config, monkeypatch):
    # Hydra composed the user's config; settling decides without composing, and the run's
    # config is composed once from the overrides (no composition to recover, none to compare).
    composed = []
    real = settle_module.compose_run

    def counted(*args, **kwargs):
        composed.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(settle_module, "compose_run", counted)
    monkeypatch.setattr(compose, "compose_run", counted)
    for overrides in (("debug=smoke",), ("+hw=cpu", "debug=smoke"), ("+hw.num_workers=0",)):
        composed.clear()
        settlement = settle(compose_config(*overrides), device=CPU_2, plan_batches=False)
        settled_config(settlement)
        assert len(composed) == 1, overrides


@pytest.fixture(autouse=True)
def _forget():
    yield
    compose.forget_composition()


@pytest.mark.parametrize(
    ("overrides", "loader"),
    [
        (("+hw=cpu",), "loader 1 worker, "),  # data.num_workers follows the profile
        (("+hw=cpu", "debug=smoke"), "loader 0 workers (data.num_workers; the profile's 1 unused)"),
        (("+hw=cpu", "data.num_workers=64"), "loader 64 workers (data.num_workers; the profile's"),
    ],
)
def test_the_settlement_prints_the_workers_the_loaders_get(compose_config, overrides, loader):
    settlement = settle(compose_config(*overrides), device=CPU_2, plan_batches=False)
    assert f"  {loader}" in str(settlement)


@pytest.mark.parametrize(
    "value",
    [
        *("16-mixed", "7.5", "NVIDIA T4", r"\bT4\b", "it's", "auto", "1e3", "1_000", "True"),
        *("null", "NaN", "inf", "/a/b", "0x1f", "-1", ".5", "a=b", "[1]", "x,y", "a$b"),
        *(14.6, 0.85, 3, None, True, (), ("a b", 1), {"k": "v w"}),
    ],
)
def test_an_override_value_reads_back_as_itself(value):
    parsed = OverridesParser.create().parse_override(f"k={override_text(value)}").value()
    assert parsed == (list(value) if isinstance(value, tuple) else value)
    assert type(parsed) is (list if isinstance(value, tuple) else type(value))


def test_a_profile_value_is_written_plain_where_the_grammar_reads_it_so():
    assert [override_text(v) for v in ("16-mixed", "auto", "t4", "7.5", "NVIDIA T4")] == [
        "16-mixed",
        "auto",
        "t4",
        "'7.5'",
        "'NVIDIA T4'",
    ]


def test_a_config_edited_in_code_is_refused_naming_the_key(compose_config):
    """The run is composed from the overrides: an edit made to the composed config in code
    would be silently lost, so it is refused before any work, naming the key."""
    cfg = compose_config("debug=smoke")
    settle(cfg, device=CPU_2, plan_batches=False)  # unedited: settles
    cfg.seed = 7
    with pytest.raises(ConfigError, match=r"^seed: changed in code .* 'seed=<value>'"):
        settle(cfg, device=CPU_2, plan_batches=False)
