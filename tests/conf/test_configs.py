"""Config composition: every profile and task, the literal `+hw=t4`, and the typo messages."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf

from tests.e2e.entry_points import run_entry_point
from vramkit.core.hardware.detect import DeviceInfo
from vramkit.core.run.settling.compose import settled_config
from vramkit.core.run.settling.settle import settle
from vramkit.tasks.sage.teacher_features.teacher_checkpoint import MissingTeacherError

REPO_ROOT = Path(__file__).resolve().parents[2]
PROFILES = sorted(p.stem for p in (REPO_ROOT / "conf" / "hw").glob("*.yaml"))
TASKS = sorted(p.stem for p in (REPO_ROOT / "conf" / "task").glob("*.yaml"))
CPU = DeviceInfo(kind="cpu", name="cpu", memory_gib=24.0, capability=None, count=0, cpu_count=2)
EXPECTED_PRECISION = {
    "t4": "16-mixed",
    "rtx2060_super": "16-mixed",
    "rtx4090_laptop": "bf16-mixed",
    "l4": "bf16-mixed",
    "a100_40gb": "bf16-mixed",
    "h100_80gb": "bf16-mixed",
    "cpu": "32-true",
}


def test_all_documented_profiles_exist():
    assert set(EXPECTED_PRECISION) <= set(PROFILES)


@pytest.mark.parametrize("profile", PROFILES)
def test_profile_reaches_trainer_and_datamodule(compose_config, profile):
    cfg = compose_config(f"+hw={profile}", "hw.strict=false")
    # The mapping is under test, not the plan a CPU rehearsal makes for the GPU (test_fit_to_budget)
    cfg = settled_config(settle(cfg, device=CPU, plan_batches=False))
    resolved = OmegaConf.to_container(cfg, resolve=True)
    assert resolved["hw"]["name"] == profile
    # strict=false on a CPU maps every GPU profile to what the CPU supports
    assert resolved["trainer"]["accelerator"] == "cpu"
    assert resolved["trainer"]["precision"] == "32-true"
    assert resolved["data"]["batch_size"] == resolved["hw"]["batch_size"]
    assert resolved["data"]["num_workers"] == resolved["hw"]["num_workers"]
    assert resolved["model"]["compile"] is False


@pytest.mark.parametrize("profile", PROFILES)
def test_profile_precision_follows_capability(compose_config, profile):
    cfg = compose_config(f"+hw={profile}")
    # settled for the profile's own GPU (as a run there is), without the plan: a plan that fits
    # changes no precision, and planning each profile would cost a minute of this CPU
    cfg = settled_config(settle(cfg, check_device=False, plan_batches=False))
    assert cfg.trainer.precision == EXPECTED_PRECISION[profile]


@pytest.mark.parametrize("task", TASKS)
def test_every_task_resolves(compose_config, task):
    cfg = compose_config(f"task={task}", "+hw=cpu")
    if task == "sage_distill":  # the student's data are a teacher's features: no teacher, no plan
        with pytest.raises(MissingTeacherError, match=r"checkpoint=latest.*train one"):
            settle(cfg, device=CPU)
        return
    cfg = settled_config(settle(cfg, device=CPU))
    resolved = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(resolved["data"]["batch_size"], int)
    assert resolved["optimized_metric"]


def test_without_hw_the_cpu_profile_is_detected(compose_config):
    cfg = compose_config()
    assert "hw" not in cfg
    settlement = settle(cfg, device=CPU)
    assert settlement.profile.name == "cpu"
    assert settled_config(settlement).trainer.precision == "32-true"


def test_typo_in_override_names_the_key(compose_config):
    with pytest.raises(ConfigCompositionException, match="precison"):
        compose_config("+hw=t4", "hw.precison=16-mixed")


def _run_train(monkeypatch, capsys, *args: str, cwd: Path) -> tuple[int, str]:
    """``python train.py <args>`` run in ``cwd``, in this process (a refusal needs no interpreter
    of its own): its exit status and stderr."""
    monkeypatch.chdir(cwd)
    monkeypatch.setenv("PROJECT_ROOT", str(REPO_ROOT))
    return run_entry_point(monkeypatch, capsys, "train.py", *args)


@pytest.mark.skipif(
    torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA"
)
def test_literal_plus_hw_t4_refuses_on_a_cpu_machine(tmp_path, monkeypatch, capsys):
    code, output = _run_train(
        monkeypatch,
        capsys,
        "+hw=t4",
        f"paths.log_dir={tmp_path}",
        f"paths.data_dir={tmp_path}/data",
        cwd=tmp_path,
    )
    assert code != 0
    assert "t4" in output
    assert "hw.strict=false" in output
    assert "+hw" in output
    # refused before any data work: nothing was generated
    assert not (tmp_path / "data").exists()


def test_typo_on_the_command_line_names_the_key(tmp_path, monkeypatch, capsys):
    code, output = _run_train(
        monkeypatch,
        capsys,
        "+hw=cpu",
        "+hw.precison=16-mixed",
        f"paths.log_dir={tmp_path}",
        cwd=tmp_path,
    )
    assert code != 0
    assert "precison" in output
