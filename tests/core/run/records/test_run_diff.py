"""The run diff says which differences between two runs change training."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from vramkit import compare_runs
from vramkit.core.hardware.detect import DeviceInfo
from vramkit.core.run.records.run_diff import (
    CHANGES,
    LOCATION,
    NEUTRAL,
    compare,
    load_overrides,
    load_run,
)
from vramkit.core.run.records.run_record import RECORD_NAME, code_version, write_run_record
from vramkit.core.run.settling.compose import compose_config
from vramkit.core.run.settling.resolvers import register_resolvers
from vramkit.core.run.settling.settle import settle, write_overrides

REPO = Path(__file__).resolve().parents[4]


def _run_folder(tmp_path: Path, name: str, overrides: list[str]) -> Path:
    """A run folder as `train()` leaves it: the resolved config and the run record."""
    register_resolvers()
    folder = tmp_path / name
    cfg = compose_config("train", ["+hw=cpu", "debug=smoke", *overrides], output_dir=folder)
    folder.mkdir(parents=True)
    (folder / "resolved_config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
    write_run_record(folder, repo=REPO)
    return folder


def _compare(tmp_path: Path, a: list[str], b: list[str]):
    run_a, run_b = _run_folder(tmp_path, "a", a), _run_folder(tmp_path, "b", b)
    (config_a, record_a), (config_b, record_b) = load_run(run_a), load_run(run_b)
    return compare(config_a, config_b, (record_a, record_b)), run_a, run_b


def test_a_learning_rate_change_changes_training(tmp_path, capsys):
    comparison, run_a, run_b = _compare(tmp_path, [], ["model.optimizer.lr=0.002"])
    assert [(d.key, d.verdict, d.kind) for d in comparison.training_changes] == [
        ("model.optimizer.lr", CHANGES, "optimizer")
    ]
    # The two folders differ in their paths too, which change nothing.
    assert "paths.output_dir" in {d.key for d in comparison.differences if d.verdict == NEUTRAL}
    assert compare_runs.main([str(run_a), str(run_b)]) == 1
    out = capsys.readouterr().out
    assert out.strip().splitlines()[-1].startswith("training differs: 1 change(s)")


def test_a_warmup_change_is_named_as_schedule(tmp_path, capsys):
    comparison, run_a, run_b = _compare(tmp_path, [], ["model.lr_schedule.warmup_steps=7"])
    assert [(d.key, d.kind) for d in comparison.training_changes] == [
        ("model.lr_schedule.warmup_steps", "schedule and warm-up")
    ]
    assert compare_runs.main([str(run_a), str(run_b)]) == 1
    assert "model.lr_schedule.warmup_steps: 50 -> 7  [schedule and warm-up]" in (
        capsys.readouterr().out
    )


def test_paths_inside_each_run_folder_are_one_line(tmp_path, capsys):
    comparison, run_a, run_b = _compare(tmp_path, [], [])
    folder_only = [d for d in comparison.differences if d.kind == "run folder"]
    assert {"paths.output_dir", "trainer.default_root_dir"} <= {d.key for d in folder_only}
    assert all(d.verdict == NEUTRAL for d in folder_only)
    assert compare_runs.main([str(run_a), str(run_b)]) == 0
    out = capsys.readouterr().out
    assert f"{len(folder_only)} path(s) differ only by each run's own folder" in out
    assert "paths.output_dir" not in out


def test_paths_of_two_checkouts_are_listed_apart_and_change_nothing(tmp_path, capsys):
    comparison, run_a, run_b = _compare(
        tmp_path,
        ["data.data_root=/clone_a/data", "paths.log_dir=/clone_a/logs"],
        ["data.data_root=/clone_b/data", "paths.log_dir=/clone_b/logs"],
    )
    located = {d.key for d in comparison.differences if d.verdict == LOCATION}
    assert {"data.data_root", "paths.log_dir"} <= located
    assert comparison.equivalent
    assert compare_runs.main([str(run_a), str(run_b)]) == 0
    out = capsys.readouterr().out
    assert "where files live (not a training change" in out
    assert "data.data_root: '/clone_a/data' -> '/clone_b/data'  [path]" in out
    assert "changes training:" not in out


def test_a_data_setting_beside_a_path_still_changes_training(tmp_path):
    comparison, _, _ = _compare(
        tmp_path, ["data.data_root=/a"], ["data.data_root=/b", "model.optimizer.lr=0.002"]
    )
    assert [d.key for d in comparison.training_changes] == ["model.optimizer.lr"]


def test_logging_changes_do_not_change_training(tmp_path):
    comparison, run_a, run_b = _compare(
        tmp_path, [], ["trainer.log_every_n_steps=5", "data.num_workers=1", "~logger.wandb"]
    )
    assert comparison.differences and comparison.equivalent
    assert {d.verdict for d in comparison.differences} <= {NEUTRAL, LOCATION}
    assert compare_runs.main([str(run_a), str(run_b)]) == 0


def test_devices_at_the_same_global_batch_do_not_change_training(tmp_path):
    comparison, _, _ = _compare(
        tmp_path,
        ["data.batch_size=4", "trainer.devices=1"],
        ["data.batch_size=2", "trainer=ddp", "trainer.devices=2"],
    )
    assert comparison.global_batch == (4, 4)
    assert comparison.equivalent, [d for d in comparison.training_changes]
    kinds = {d.key: d.kind for d in comparison.differences}
    assert kinds["data.batch_size"] == kinds["trainer.devices"] == "global batch"


def test_ddp_without_synchronised_batchnorm_changes_training():
    single = {"data.batch_size": 4, "trainer.devices": 1}
    synced = {"data.batch_size": 2, "trainer.devices": 2, "trainer.sync_batchnorm": True}
    unsynced = {**synced, "trainer.sync_batchnorm": False}
    assert compare(single, synced).equivalent
    assert [d.key for d in compare(single, unsynced).training_changes] == ["trainer.sync_batchnorm"]


def test_a_different_global_batch_changes_training(tmp_path):
    comparison, _, _ = _compare(tmp_path, ["data.batch_size=4"], ["data.batch_size=2"])
    assert comparison.global_batch == (4, 2)
    assert [d.key for d in comparison.training_changes] == ["data.batch_size"]


def test_a_key_the_rules_do_not_know_counts_as_a_change():
    comparison = compare({"model.net.new_knob": 1}, {"model.net.new_knob": 2})
    assert not comparison.equivalent
    assert compare({"mystery": 1}, {"mystery": 2}).training_changes[0].kind == "unknown key"


def test_the_record_names_the_commit_and_libraries(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    record = json.loads(write_run_record(folder, repo=REPO).read_text())
    assert record["code"] == code_version(REPO)
    assert record["environment"]["libraries"]["torch"]
    assert (folder / RECORD_NAME).is_file()


def test_an_unreadable_run_exits_2(tmp_path, capsys):
    assert compare_runs.main([str(tmp_path), str(tmp_path)]) == 2
    assert "not a vramkit run folder" in capsys.readouterr().err


@pytest.mark.parametrize("pick", ["last.ckpt"])
def test_a_checkpoint_stands_for_its_run_folder(tmp_path, pick):
    run = _run_folder(tmp_path, "a", [])
    (run / "checkpoints").mkdir()
    (run / "checkpoints" / pick).write_bytes(b"")
    assert load_run(run / "checkpoints" / pick) == load_run(run)


@pytest.mark.parametrize(
    ("file", "text", "says"),
    [
        ("resolved_config.yaml", "a: [1, 2\n  b: :\n", "not readable YAML"),
        ("resolved_config.yaml", "- 1\n- 2\n", "not a config"),
        ("run_environment.json", '{"code', "not readable JSON"),
    ],
)
def test_a_corrupt_run_record_is_an_error_not_a_difference(tmp_path, capsys, file, text, says):
    # exit 1 means "training differs": a file that cannot be read must not say that
    run = tmp_path / "run"
    run.mkdir()
    (run / "resolved_config.yaml").write_text("seed: 1\n")
    (run / file).write_text(text)
    assert compare_runs.main([str(run), str(run)]) == 2
    err = capsys.readouterr().err
    assert says in err and file in err and len(err.strip().splitlines()) == 1


def test_the_overrides_only_one_run_has_are_listed_as_typed(tmp_path, capsys):
    cpu = DeviceInfo("cpu", "CPU", 16.0, None, count=0, cpu_count=2)
    folders = []
    for name, extra in (("a", []), ("b", ["model.optimizer.lr=0.002", "hw.batch_size=3"])):
        folder = _run_folder(tmp_path, name, extra)
        cfg = compose_config("train", ["+hw=cpu", "debug=smoke", *extra], output_dir=folder)
        write_overrides(folder, settle(cfg, device=cpu, plan_batches=False))
        folders.append(folder)
    assert "+hw=cpu" in load_overrides(folders[0] / "checkpoints" / "last.ckpt")
    assert compare_runs.main([str(f) for f in folders]) == 1
    out = capsys.readouterr().out.splitlines()
    default_batch = compose_config("train", ["debug=smoke"]).batch_size_defaults.train
    only_a = f"paths.output_dir={folders[0]} ++hw.batch_size={default_batch}"
    only_b = f"paths.output_dir={folders[1]} model.optimizer.lr=0.002 hw.batch_size=3"
    assert out[1:3] == [
        f"overrides only {folders[0]} has (overrides.txt): {only_a}",
        f"overrides only {folders[1]} has (overrides.txt): {only_b}",
    ]


def test_a_run_without_overrides_txt_is_compared_without_them(tmp_path):
    assert load_overrides(_run_folder(tmp_path, "old", [])) is None


def test_the_progress_line_interval_does_not_change_training():
    a = {"callbacks.progress_line.interval_s": 30}
    b = {"callbacks.progress_line.interval_s": 5}
    (difference,) = compare(a, b).differences
    assert difference.verdict == NEUTRAL
