"""settle_profile end to end: Hydra's `+hw=` group, detection, refusal, rehearsal, batches; the
decisions come back as values (the profile and its lines), the config given is left as it was."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from hydra.errors import ConfigCompositionException
from omegaconf import DictConfig, OmegaConf, open_dict

from vramkit.core.hardware.detect import DeviceInfo
from vramkit.core.hardware.device_check import HardwareMismatchError
from vramkit.core.hardware.profile import HardwareProfile, ProfileError
from vramkit.core.run.settling.resolve_hardware import SettledProfile, settle_profile
from vramkit.core.run.settling.resolvers import register_resolvers

CONF_DIR = Path(__file__).resolve().parents[4] / "conf"
CPU_2 = DeviceInfo("cpu", "CPU", 16.0, None, count=0, cpu_count=2)
T4 = DeviceInfo("cuda", "Tesla T4", 14.57, (7, 5), count=1, cpu_count=2)
H100 = DeviceInfo("cuda", "NVIDIA H100 80GB HBM3", 79.19, (9, 0), count=1, cpu_count=16)
register_resolvers()

# A stand-in for conf/train.yaml that reads the profile the way the trainer and data configs do.
PRIMARY = """\
defaults:
  - _self_
hydra:
  searchpath:
    - file://{conf_dir}
batch_size_defaults:
  train: 8
  val: 16
data:
  batch_size: ${{hw.batch_size}}
  val_batch_size: ${{hw.val_batch_size}}
  num_workers: ${{hw.num_workers}}
  pin_memory: ${{hw.pin_memory}}
trainer:
  accelerator: ${{hw.accelerator}}
  devices: ${{hw.devices}}
  num_nodes: ${{hw.num_nodes}}
  precision: ${{hw.precision}}
  accumulate_grad_batches: ${{hw.accumulate_grad_batches}}
model:
  compile: ${{hw.compile}}
"""


@pytest.fixture(autouse=True)
def no_hydra_run() -> Iterator[None]:
    """Start each test outside a Hydra run, whatever an earlier test left in HydraConfig."""
    instance = HydraConfig.instance()
    saved = instance.cfg
    instance.cfg = None
    yield
    instance.cfg = saved


@pytest.fixture
def compose_hw(tmp_path: Path) -> Iterator[Callable[..., DictConfig]]:
    """Compose the stand-in primary config with overrides, as `python train.py …` would.

    With `hydra_run=True` the Hydra run context is set too, so the overrides are known.
    """
    (tmp_path / "primary.yaml").write_text(PRIMARY.format(conf_dir=CONF_DIR))

    def _compose(*overrides: str, hydra_run: bool = False) -> DictConfig:
        GlobalHydra.instance().clear()
        with initialize_config_dir(config_dir=str(tmp_path), version_base="1.3"):
            cfg = compose("primary", overrides=list(overrides), return_hydra_config=hydra_run)
        if hydra_run:
            HydraConfig.instance().set_config(cfg)
            with open_dict(cfg):
                del cfg.hydra
        return cfg

    yield _compose
    GlobalHydra.instance().clear()


def resolved(cfg: DictConfig, profile: HardwareProfile) -> dict:
    """`cfg` resolved with `profile` as its `hw` node, as the run's composition gives it."""
    run = cfg.copy()
    with open_dict(run):
        run.hw = profile.model_dump()
    return OmegaConf.to_container(run, resolve=True)


def said(settled: SettledProfile) -> str:
    return "\n".join(settled.lines)


def test_plus_hw_on_its_own_gpu_fills_every_interpolation(compose_hw):
    cfg = compose_hw("+hw=t4")
    settled = settle_profile(cfg, conf_dir=CONF_DIR, device=T4)
    profile = settled.profile
    assert cfg.hw.batch_size == "auto"  # decided as a value; the config given is as composed
    values = resolved(cfg, profile)
    assert values["trainer"] == {
        "accelerator": "gpu",
        "devices": 1,
        "num_nodes": 1,
        "precision": "16-mixed",
        "accumulate_grad_batches": 1,
    }
    assert values["data"]["batch_size"] == 8 == profile.batch_size
    assert values["data"]["val_batch_size"] == 16 == profile.val_batch_size
    assert (values["data"]["num_workers"], values["data"]["pin_memory"]) == (2, True)
    assert values["model"]["compile"] is False
    out = said(settled)
    assert "batch_size 8 (batch_size_defaults.train)" in out
    assert "val_batch_size 16 (batch_size_defaults.val)" in out


def test_without_hw_a_fake_t4_is_detected(compose_hw):
    cfg = compose_hw()
    assert "hw" not in cfg
    settled = settle_profile(cfg, conf_dir=CONF_DIR, device=T4)
    assert "hw" not in cfg
    assert settled.profile.name == "t4" and settled.requested.detected
    assert resolved(cfg, settled.profile)["trainer"]["precision"] == "16-mixed"
    lines = [line for line in settled.lines if "detected" in line]
    assert len(lines) == 1
    assert "'Tesla T4'" in lines[0]
    assert "conf/hw/t4.yaml" in lines[0]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without CUDA")
def test_without_hw_this_cpu_machine_gets_the_cpu_profile(compose_hw):
    cfg = compose_hw()
    settled = settle_profile(cfg, conf_dir=CONF_DIR)
    assert settled.profile.name == "cpu"
    assert resolved(cfg, settled.profile)["trainer"]["precision"] == "32-true"
    assert "no CUDA device" in said(settled)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without CUDA")
def test_plus_hw_t4_on_this_cpu_machine_is_refused(compose_hw):
    cfg = compose_hw("+hw=t4")
    with pytest.raises(HardwareMismatchError) as caught:
        settle_profile(cfg, conf_dir=CONF_DIR)
    message = str(caught.value)
    for fragment in ("'t4'", "conf/hw/t4.yaml", "no CUDA", "+hw", "hw.strict=false"):
        assert fragment in message


def test_strict_false_rehearses_the_profile_on_the_cpu(compose_hw):
    cfg = compose_hw("+hw=t4", "hw.strict=false")
    settled = settle_profile(cfg, conf_dir=CONF_DIR, device=CPU_2)
    profile = settled.profile
    values = resolved(cfg, profile)
    assert values["trainer"]["accelerator"] == "cpu"
    assert values["trainer"]["precision"] == "32-true"
    assert values["data"]["pin_memory"] is False
    assert profile.name == "t4"
    rehearsal = [line for line in settled.lines if "rehearsing" in line]
    assert len(rehearsal) == 1
    assert "precision 16-mixed → 32-true" in rehearsal[0]


def test_hw_keys_without_a_profile_refine_the_detected_one(compose_hw):
    cfg = compose_hw("+hw.batch_size=4")
    settled = settle_profile(cfg, conf_dir=CONF_DIR, device=T4)
    profile = settled.profile
    assert (profile.name, profile.batch_size, profile.val_batch_size) == ("t4", 4, 16)
    assert resolved(cfg, profile)["data"]["batch_size"] == 4
    assert settled.requested.given == {"batch_size": 4}  # what the user's overrides composed
    assert "hw keys given on top: batch_size" in said(settled)


def test_typo_in_plus_form_names_key_file_and_suggestion(compose_hw):
    cfg = compose_hw("+hw=t4", "+hw.precison=16-mixed")
    with pytest.raises(ProfileError) as caught:
        settle_profile(cfg, conf_dir=CONF_DIR, device=T4)
    message = str(caught.value)
    assert "hw.precison" in message
    assert "conf/hw/t4.yaml" in message
    assert "did you mean hw.precision?" in message


def test_typo_in_a_hydra_run_also_names_the_override(compose_hw):
    cfg = compose_hw("+hw=t4", "+hw.precison=16-mixed", hydra_run=True)
    with pytest.raises(ProfileError, match=r"command-line override '\+hw\.precison=16-mixed'"):
        settle_profile(cfg, conf_dir=CONF_DIR, device=T4)


def test_typo_in_plain_form_is_refused_by_hydra_naming_the_key(compose_hw):
    with pytest.raises(ConfigCompositionException, match=r"hw\.precison"):
        compose_hw("+hw=t4", "hw.precison=16-mixed")


def test_wrong_type_names_the_key_the_type_and_the_file(compose_hw):
    cfg = compose_hw("+hw=t4", "hw.num_workers=four")
    with pytest.raises(ProfileError) as caught:
        settle_profile(cfg, conf_dir=CONF_DIR, device=T4)
    assert "hw.num_workers: expected int, got 'four'" in str(caught.value)
    assert "conf/hw/t4.yaml" in str(caught.value)


def test_target_effective_batch_sets_accumulation(compose_hw):
    cfg = compose_hw("+hw=t4", "hw.batch_size=6", "hw.target_effective_batch=64")
    settled = settle_profile(cfg, conf_dir=CONF_DIR, device=T4)
    profile = settled.profile
    assert profile.accumulate_grad_batches == 11  # ceil(64 / 6)
    assert resolved(cfg, profile)["trainer"]["accumulate_grad_batches"] == 11
    assert (profile.batch_size, profile.val_batch_size) == (6, 16)
    assert "accumulate_grad_batches 11" in said(settled)


def test_num_nodes_reaches_the_trainer_and_divides_the_target_global_batch(compose_hw):
    cfg = compose_hw("+hw=t4", "hw.batch_size=4", "hw.num_nodes=2", "hw.target_effective_batch=64")
    settled = settle_profile(cfg, conf_dir=CONF_DIR, device=T4)
    profile = settled.profile
    assert profile.accumulate_grad_batches == 8  # ceil(64 / (4 per device × 1 device × 2 nodes))
    trainer = resolved(cfg, profile)["trainer"]
    assert (trainer["num_nodes"], trainer["accumulate_grad_batches"]) == (2, 8)
    assert "× 2 nodes × 8 = 64" in said(settled)


def test_a_larger_gpu_caps_the_process(compose_hw, monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(
        torch.cuda, "set_per_process_memory_fraction", lambda f, d=None: calls.append((f, d))
    )
    cfg = compose_hw("+hw=t4")
    settled = settle_profile(cfg, conf_dir=CONF_DIR, device=H100)
    assert calls == [(pytest.approx(14.6 / 79.19), 0)]
    assert "capping this process at 18.4%" in said(settled)


def test_auto_batch_size_without_a_task_default_is_an_error():
    cfg = OmegaConf.create({"hw": OmegaConf.load(CONF_DIR / "hw" / "cpu.yaml"), "data": {}})
    with pytest.raises(ProfileError, match=r"no batch_size_defaults\.train") as caught:
        settle_profile(cfg, conf_dir=CONF_DIR, device=CPU_2)
    assert "conf/hw/cpu.yaml" in str(caught.value)


def test_a_task_default_that_is_not_a_positive_int_is_an_error():
    defaults = {"train": 8, "val": "16"}
    hw = OmegaConf.load(CONF_DIR / "hw" / "cpu.yaml")
    cfg = OmegaConf.create({"hw": hw, "batch_size_defaults": defaults})
    with pytest.raises(ProfileError, match=r"batch_size_defaults\.val must be a positive int"):
        settle_profile(cfg, conf_dir=CONF_DIR, device=CPU_2)


def test_the_config_given_is_left_as_composed(compose_hw):
    cfg = compose_hw("+hw=cpu")
    before = OmegaConf.to_container(cfg, resolve=False)
    settled = settle_profile(cfg, conf_dir=CONF_DIR, device=CPU_2)
    assert settled.profile.batch_size == 8
    assert OmegaConf.to_container(cfg, resolve=False) == before
    assert OmegaConf.is_struct(cfg.hw)
