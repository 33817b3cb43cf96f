"""The resume contract: a checkpoint of another model, an unreadable file or a setting that breaks
exactness is refused in one line before anything is written; allowed changes are recorded."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from omegaconf import DictConfig, OmegaConf

from vramkit.core.callbacks.checkpoints.checkpoint_contract import CONTRACT_KEY
from vramkit.core.config.instantiate import instantiate
from vramkit.core.config.schema import ConfigError
from vramkit.core.hardware.detect import load_profile_file
from vramkit.core.run.folder.run_folder import CHECKPOINTS, RUN_CONFIG
from vramkit.core.run.resume_contract import (
    ResumeContract,
    ResumeSettings,
    ResumeVerdict,
    check_resume,
    exactness_changes,
    keep_trained_batch,
    load_initial_weights,
    run_contract,
)
from vramkit.core.run.settling.settle import Settlement

REPO_ROOT = Path(__file__).resolve().parents[3]
FIRST_RUN = ("+hw=cpu", "debug=smoke")


def _model(cfg: DictConfig) -> torch.nn.Module:
    node = OmegaConf.create(OmegaConf.to_container(cfg.model, resolve=False))
    node.compile = False  # ${hw.compile} cannot resolve outside its config
    node.channels_last = False  # nor ${hw.channels_last}
    return instantiate(node)


def _run_folder(folder: Path, cfg: DictConfig, model: str = "dbnet_tiny") -> Path:
    """What a finished run leaves: Hydra's records, its resolved config, a Lightning checkpoint."""
    (folder / ".hydra").mkdir(parents=True)
    OmegaConf.save(cfg, folder / ".hydra" / "config.yaml")
    choices = {"task": cfg.task_name, "model": model}
    OmegaConf.save({"hydra": {"runtime": {"choices": choices}}}, folder / ".hydra" / "hydra.yaml")
    (folder / RUN_CONFIG).write_text("seed: 42\n")
    checkpoint = folder / CHECKPOINTS / "last.ckpt"
    checkpoint.parent.mkdir()
    state = {"state_dict": _model(cfg).state_dict(), "pytorch-lightning_version": "2.6.6"}
    torch.save({**state, "epoch": 0, "global_step": 4}, checkpoint)
    return checkpoint


@pytest.fixture
def finished_run(compose_config, tmp_path) -> Path:
    return _run_folder(tmp_path / "first", compose_config(*FIRST_RUN))


def test_a_resume_of_another_model_width_names_the_first_difference_and_the_model_it_had(
    compose_config, finished_run
):
    cfg = compose_config(*FIRST_RUN, "model=dbnet_r18", f"ckpt_path={finished_run}")
    with pytest.raises(ConfigError) as refused:
        check_resume(cfg)
    message = str(refused.value)
    assert "\n" not in message
    assert (
        "parameters differ in shape, first net.backbone.conv1.weight [16,3,7,7] in the checkpoint "
        "vs [64,3,7,7] in this model; it was trained with task=text_detection, model=dbnet_tiny"
    ) in message


def test_a_checkpoint_of_another_task_is_refused_by_name(compose_config, finished_run):
    cfg = compose_config("+hw=cpu", "task=arc_teacher", f"ckpt_path={finished_run}")
    with pytest.raises(ConfigError, match="a checkpoint of task text_detection, this run is task"):
        check_resume(cfg)


def test_settings_that_break_exactness_are_listed_with_the_way_to_start_afresh(
    compose_config, finished_run
):
    cfg = compose_config(
        *FIRST_RUN,
        f"ckpt_path={finished_run}",
        "model.optimizer.lr=0.01",
        "hw.accumulate_grad_batches=2",
        "seed=7",
        "trainer.max_epochs=5",  # may change
        "hw.batch_size=2",  # per device: compared as settled (keep_trained_batch)
        "data.num_workers=2",  # how samples arrive, not which
        "model.channels_last=false",  # the weights' layout, not their values
        "data.channels_last=false",
    )
    with pytest.raises(ConfigError) as refused:
        check_resume(cfg)
    lines = str(refused.value).splitlines()
    assert lines[1:4] == [
        "  hw.accumulate_grad_batches: 1 -> 2",
        "  model.optimizer.lr: 0.004 -> 0.01",
        "  seed: 42 -> 7",
    ]
    assert f"init_from={finished_run}" in lines[4]
    assert "resume.allow_changes=true" in lines[4]


def test_a_resume_with_the_runs_settings_and_a_longer_schedule_passes(compose_config, finished_run):
    cfg = compose_config(*FIRST_RUN, f"ckpt_path={finished_run}", "trainer.max_epochs=5")
    assert check_resume(cfg) == ResumeVerdict()


def test_allowed_changes_come_back_as_a_verdict_for_the_run_to_record(compose_config, finished_run):
    cfg = compose_config(
        *FIRST_RUN,
        f"ckpt_path={finished_run}",
        "resume.allow_changes=true",
        "model.optimizer.lr=0.01",
        "data.image_size=160",
    )
    changes = ["data.image_size: 128 -> 160", "model.optimizer.lr: 0.004 -> 0.01"]
    verdict = check_resume(cfg)
    assert verdict.changes == tuple(changes)
    assert list(cfg.resume.changes) == []  # checked, not changed: the run records the verdict
    assert verdict.overrides == (
        "++resume.changes=['data.image_size: 128 -> 160','model.optimizer.lr: 0.004 -> 0.01']",
    )
    assert "resume: applying model.optimizer.lr: 0.004 -> 0.01 (resume.allow_changes=true)" in (
        verdict.lines
    )
    # What trains: the new rate, which CheckpointContract applies after the optimizer loads.
    assert cfg.model.optimizer.lr == 0.01
    assert check_resume(cfg) is verdict  # asked again by train(): nothing read twice


def test_allowed_changes_it_cannot_apply_are_still_refused(compose_config, finished_run):
    cfg = compose_config(
        *FIRST_RUN,
        f"ckpt_path={finished_run}",
        "resume.allow_changes=true",
        "seed=7",
        "model.optimizer._target_=torch.optim.SGD",
    )
    with pytest.raises(ConfigError) as refused:
        check_resume(cfg)
    message = str(refused.value)
    assert "\n" not in message
    assert (
        "cannot apply model.optimizer._target_: torch.optim.AdamW -> torch.optim.SGD (" in message
    )
    assert "seed: 42 -> 7 (the random streams and the data order continue" in message
    assert message.endswith(f"start a new run from its weights with init_from={finished_run}")


def test_a_checkpoint_without_its_run_folder_is_checked_against_its_contract(
    compose_config, tmp_path
):
    # The drill: copied elsewhere, resumed with other settings: exit 0, nothing said.
    first = compose_config(*FIRST_RUN)
    copied = tmp_path / "copied.ckpt"
    contract = run_contract(first, _settled(first, batch_size=4).profile)
    state = {"state_dict": _model(first).state_dict(), "pytorch-lightning_version": "2.6.6"}
    torch.save({**state, "epoch": 0, "global_step": 4, CONTRACT_KEY: contract}, copied)
    cfg = compose_config(
        *FIRST_RUN,
        f"ckpt_path={copied}",
        "seed=7",
        "data.image_size=160",
        "model.optimizer.lr=0.5",
    )
    with pytest.raises(ConfigError) as refused:
        check_resume(cfg)
    assert str(refused.value).splitlines()[1:4] == [
        "  data.image_size: 128 -> 160",
        "  model.optimizer.lr: 0.004 -> 0.5",
        "  seed: 42 -> 7",
    ]


OLD_STYLE_DATA = {
    "data.train_dir": None,
    "data.val_dir": None,
    "data.persistent_workers": True,
    "data.strict": False,
    "trainer.gradient_clip_val": None,
    "model.loss.prob_weight": 5.0,
}
"""What conf/data/synthetic_text.yaml, conf/trainer/default.yaml and conf/model/dbnet_r18.yaml
wrote for these keys before they left their defaults to the settings classes and signatures
(``???`` composed as ``${settings_default:…}``): a run recorded then holds them."""


def _old_style(cfg: DictConfig) -> DictConfig:
    recorded = cfg.copy()
    for key, value in OLD_STYLE_DATA.items():
        OmegaConf.update(recorded, key, value)
    return recorded


def test_a_run_folder_recorded_with_the_numbers_resumes_under_the_class_defaults(
    compose_config, tmp_path
):
    composed = compose_config(*FIRST_RUN)
    assert OmegaConf.is_interpolation(composed.data, "strict")  # what the schema composes
    assert OmegaConf.is_interpolation(composed.trainer, "gradient_clip_val")
    assert OmegaConf.is_interpolation(composed.model.loss, "prob_weight")
    checkpoint = _run_folder(tmp_path / "old", _old_style(composed))
    assert check_resume(compose_config(*FIRST_RUN, f"ckpt_path={checkpoint}")) == ResumeVerdict()
    changed = compose_config(*FIRST_RUN, f"ckpt_path={checkpoint}", "data.strict=true")
    with pytest.raises(ConfigError) as refused:
        check_resume(changed)
    assert str(refused.value).splitlines()[1:-1] == ["  data.strict: False -> True"]


def test_a_contract_written_with_the_numbers_resumes_under_the_class_defaults(
    compose_config, tmp_path
):
    first = compose_config(*FIRST_RUN)
    contract = run_contract(first, _settled(first, batch_size=4).profile)
    # recorded as values: the contract says what trained even if a class default changes later
    assert contract["settings"]["data.strict"] is False
    assert contract["settings"]["data.train_dir"] is None
    contract["settings"].update(OLD_STYLE_DATA)
    state = {"state_dict": _model(first).state_dict(), "pytorch-lightning_version": "2.6.6"}
    copied = tmp_path / "copied.ckpt"
    torch.save({**state, "epoch": 0, "global_step": 4, CONTRACT_KEY: contract}, copied)
    assert check_resume(compose_config(*FIRST_RUN, f"ckpt_path={copied}")) == ResumeVerdict()
    changed = compose_config(*FIRST_RUN, f"ckpt_path={copied}", "data.train_dir=/elsewhere")
    with pytest.raises(ConfigError) as refused:
        check_resume(changed)
    assert str(refused.value).splitlines()[1:-1] == ["  data.train_dir: None -> /elsewhere"]


def test_a_recorded_class_default_compares_by_value_but_a_foreign_one_as_written(tmp_path):
    default = (
        "${settings_default:vramkit.tasks.text_detection.data.datamodule.TextDetectionDataModule,"
    )
    recorded = {"data": {"strict": default + "strict}", "seed": "${settings_default:os.path,x}"}}
    current = OmegaConf.create({"data": {"strict": False, "seed": 1}})
    assert exactness_changes(recorded, current) == [
        ("data.seed", "${settings_default:os.path,x}", 1)
    ]


def _settled(cfg: DictConfig, *, batch_size: int, accumulate: int = 1) -> Settlement:
    profile = load_profile_file(REPO_ROOT / "conf" / "hw" / "cpu.yaml", display_root=REPO_ROOT)
    return Settlement(
        profile=profile.profile.model_copy(
            update={
                "batch_size": batch_size,
                "val_batch_size": 4,
                "accumulate_grad_batches": accumulate,
            }
        ),
        device="CPU",
        detected=False,
        remedy=(),
        remedy_record=None,
        memory_plan=None,
        decisions=(),
        user_overrides=(),
        applied=(),
        overrides=(f"++hw.batch_size={batch_size}",),
        config_name="train",
        conf_dir=str(REPO_ROOT / "conf"),
    )


def _checkpoint_with_contract(folder: Path, cfg: DictConfig, **batch: int) -> Path:
    path = folder / "trained.ckpt"
    contract = run_contract(cfg, _settled(cfg, **batch).profile)
    torch.save({"state_dict": {}, CONTRACT_KEY: contract}, path)
    return path


@pytest.mark.parametrize(
    ("fits", "expected"),
    [(1, (1, 4)), (3, (2, 2)), (4, (4, 1)), (16, (4, 1))],
)
def test_a_resume_keeps_the_samples_per_optimizer_step(compose_config, tmp_path, fits, expected):
    # The drill: resumed with less memory, batch 4 became 1 and the run trained 4x the
    # steps; the settled batch is regrouped: same samples per optimizer step.
    checkpoint = _checkpoint_with_contract(tmp_path, compose_config(*FIRST_RUN), batch_size=4)
    cfg = compose_config(*FIRST_RUN, f"ckpt_path={checkpoint}")
    kept = keep_trained_batch(cfg, _settled(cfg, batch_size=fits))
    assert (kept.profile.batch_size, kept.profile.accumulate_grad_batches) == expected
    if expected != (fits, 1):
        assert kept.overrides[-2:] == (
            f"++hw.batch_size={expected[0]}",
            f"++hw.accumulate_grad_batches={expected[1]}",
        )
        assert [o for o in kept.overrides if o.startswith("++hw.batch_size=")] == [
            f"++hw.batch_size={expected[0]}"
        ]
        (said,) = kept.warnings  # returned for the run to log, not logged while deciding
        assert said.startswith(f"resume: batch {expected[0]} × {expected[1]} accumulated")
    else:
        assert kept.warnings == ()


def test_a_resume_in_another_number_of_processes_or_precision_is_refused_in_one_line(
    compose_config, tmp_path
):
    checkpoint = _checkpoint_with_contract(tmp_path, compose_config(*FIRST_RUN), batch_size=4)
    cfg = compose_config(*FIRST_RUN, f"ckpt_path={checkpoint}")
    settled = _settled(cfg, batch_size=4)
    two = dataclasses.replace(settled, profile=settled.profile.model_copy(update={"devices": 2}))
    with pytest.raises(ConfigError, match=r"this run has 2 processes, the checkpoint's 1 \("):
        keep_trained_batch(cfg, two)
    bf16 = dataclasses.replace(
        settled, profile=settled.profile.model_copy(update={"precision": "bf16-mixed"})
    )
    with pytest.raises(ConfigError) as refused:
        keep_trained_batch(cfg, bf16)
    assert "\n" not in str(refused.value)
    assert "settles hw.precision bf16-mixed, the checkpoint trained at 32-true" in str(
        refused.value
    )
    allowed = compose_config(*FIRST_RUN, f"ckpt_path={checkpoint}", "resume.allow_changes=true")
    assert keep_trained_batch(allowed, bf16).profile.precision == "bf16-mixed"


def test_evaluation_checks_the_model_but_not_the_training_settings(compose_config, finished_run):
    ok = compose_config(*FIRST_RUN, f"ckpt_path={finished_run}", "seed=7", config_name="eval")
    assert check_resume(ok) == ResumeVerdict()
    wider = compose_config(
        *FIRST_RUN, f"ckpt_path={finished_run}", "model=dbnet_r18", config_name="eval"
    )
    with pytest.raises(ConfigError, match="parameters differ in shape"):
        check_resume(wider)


def test_resuming_and_starting_from_weights_at_once_is_refused(compose_config, finished_run):
    cfg = compose_config(*FIRST_RUN, f"ckpt_path={finished_run}", f"init_from={finished_run}")
    with pytest.raises(ConfigError, match="ckpt_path and init_from are both set"):
        check_resume(cfg)


def test_init_from_is_checked_like_a_resume_and_loads_the_weights(compose_config, finished_run):
    wider = compose_config(*FIRST_RUN, "model=dbnet_r18", f"init_from={finished_run}")
    with pytest.raises(ConfigError, match=r"^init_from .*parameters differ in shape"):
        check_resume(wider)
    cfg = compose_config(*FIRST_RUN, f"init_from={finished_run}", "model.optimizer.lr=0.01")
    assert check_resume(cfg) == ResumeVerdict()  # a new run: its settings are its own
    model = _model(cfg)
    load_initial_weights(model, finished_run)
    saved = torch.load(finished_run, weights_only=True)["state_dict"]
    assert all(torch.equal(model.state_dict()[k], v) for k, v in saved.items())


def test_the_hydra_callback_refuses_in_one_line_exit_2(compose_config, tmp_path, capsys):
    half = tmp_path / "half.ckpt"
    torch.save({"state_dict": {"w": torch.zeros(1000)}}, half)
    half.write_bytes(half.read_bytes()[:2000])
    cfg = compose_config(*FIRST_RUN, f"ckpt_path={half}")
    with pytest.raises(SystemExit) as stopped:
        ResumeContract().on_run_start(config=cfg)
    assert stopped.value.code == 2
    assert capsys.readouterr().err == (
        f"error: ckpt_path: {half} is truncated (2000 bytes of a torch.save archive whose end is "
        "missing)\n"
    )


def test_exactness_changes_compare_unresolved_leaves_and_absent_keys():
    old = OmegaConf.create({"data": {"batch_size": "${hw.batch_size}"}, "seed": 1})
    new = OmegaConf.create(
        {"data": {"batch_size": "${hw.batch_size}", "extra": 3}, "seed": 1, "x": 2}
    )
    assert exactness_changes(old, new) == [("data.extra", "<absent>", 3)]


def test_the_yaml_defaults_are_the_settings_defaults():
    conf = OmegaConf.load(REPO_ROOT / "conf" / "train.yaml")
    defaults = {name: field.default for name, field in ResumeSettings.model_fields.items()}
    assert ResumeSettings.from_config(conf.resume, key_prefix="resume.") == ResumeSettings()
    assert set(conf.resume) == set(defaults)
    assert conf.init_from is None


def test_a_misspelt_resume_setting_is_refused_even_without_a_checkpoint(compose_config):
    cfg = compose_config(*FIRST_RUN, "resume.allow_changes=maybe")
    with pytest.raises(ConfigError, match=r"resume\.allow_changes"):
        check_resume(cfg)


def test_the_hydra_callback_checks_and_changes_nothing(compose_config, finished_run):
    cfg = compose_config(
        *FIRST_RUN, f"ckpt_path={finished_run}", "resume.allow_changes=true", "seed=42"
    )
    changed = compose_config(
        *FIRST_RUN, f"ckpt_path={finished_run}", "resume.allow_changes=true", "data.image_size=160"
    )
    for config in (cfg, changed):
        before = OmegaConf.to_container(config, resolve=False)
        ResumeContract().on_run_start(config=config)
        assert OmegaConf.to_container(config, resolve=False) == before
    assert check_resume(changed).changes == ("data.image_size: 128 -> 160",)
