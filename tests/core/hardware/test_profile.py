"""The profile schema and the seven shipped profiles: validation, errors and the summary."""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from vramkit.core.hardware.profile import (
    HardwareProfile,
    ProfileError,
    ProfileSource,
    describe_profile,
    validate_profile,
)

HW_DIR = Path(__file__).resolve().parents[3] / "conf" / "hw"
SHIPPED = ("t4", "rtx4090_laptop", "rtx2060_super", "l4", "a100_40gb", "h100_80gb", "cpu")
T4_SOURCE = ProfileSource("conf/hw/t4.yaml")


def _raw(name: str) -> dict:
    return OmegaConf.to_container(OmegaConf.load(HW_DIR / f"{name}.yaml"))


def _t4_with(**changes: object) -> dict:
    return {**_raw("t4"), **changes}


@pytest.mark.parametrize("name", SHIPPED)
def test_every_shipped_profile_validates_and_is_named_after_its_file(name):
    profile = validate_profile(OmegaConf.load(HW_DIR / f"{name}.yaml"), ProfileSource(name))
    assert profile.name == name


@pytest.mark.parametrize("name", SHIPPED)
def test_every_shipped_profile_states_every_field_with_a_comment(name):
    lines = (HW_DIR / f"{name}.yaml").read_text().splitlines()
    field_lines = [line for line in lines if line and not line.startswith("#")]
    keys = [line.split(":", 1)[0] for line in field_lines]
    assert keys == list(HardwareProfile.model_fields)
    uncommented = [line for line in field_lines if "  # " not in line]
    assert uncommented == []


def test_every_schema_field_has_a_one_line_docstring():
    undocumented = [
        name for name, info in HardwareProfile.model_fields.items() if not info.description
    ]
    assert undocumented == []


# name, memory GiB, capability, bf16, flash, fp16 TFLOPS, bandwidth GB/s (README, datasheets)
FACTS = [
    ("t4", 14.6, "7.5", False, False, 65.0, 320.0),
    ("rtx4090_laptop", 15.7, "8.9", True, True, 66.0, 576.0),
    ("rtx2060_super", 7.8, "7.5", False, False, 29.0, 448.0),
    ("l4", 22.0, "8.9", True, True, 121.0, 300.0),
    ("a100_40gb", 39.4, "8.0", True, True, 312.0, 1555.0),
    ("h100_80gb", 79.1, "9.0", True, True, 989.0, 3350.0),
]


@pytest.mark.parametrize(("name", "memory", "cc", "bf16", "flash", "fp16", "bandwidth"), FACTS)
def test_gpu_facts_match_the_design_notes(name, memory, cc, bf16, flash, fp16, bandwidth):
    profile = validate_profile(_raw(name), ProfileSource(name))
    assert profile.memory_gib == memory
    assert profile.compute_capability == cc
    assert (profile.bf16, profile.flash_attention) == (bf16, flash)
    assert profile.peak_tflops_fp16 == fp16
    assert profile.bandwidth_gbs == bandwidth
    assert (profile.peak_tflops_bf16 is None) == (not bf16)


@pytest.mark.parametrize("name", SHIPPED)
def test_decisions_follow_the_capability(name):
    profile = validate_profile(_raw(name), ProfileSource(name))
    assert profile.batch_size == profile.val_batch_size == "auto"
    if profile.accelerator == "cpu":
        assert (profile.precision, profile.pin_memory, profile.compile) == ("32-true", False, False)
        assert profile.num_workers == 1
    elif profile.capability >= (8, 0):
        assert (profile.precision, profile.pin_memory, profile.compile) == (
            "bf16-mixed",
            True,
            True,
        )
    else:
        assert (profile.precision, profile.pin_memory, profile.compile) == ("16-mixed", True, False)


def test_unknown_key_names_the_key_the_file_and_the_closest_valid_key():
    with pytest.raises(ProfileError) as caught:
        validate_profile(_t4_with(precison="16-mixed"), T4_SOURCE)
    message = str(caught.value)
    assert "hw.precison" in message
    assert "conf/hw/t4.yaml" in message
    assert "did you mean hw.precision?" in message
    assert caught.value.keys == ("precison",)


def test_unknown_key_without_a_close_match_suggests_nothing():
    with pytest.raises(ProfileError, match=r"hw\.zzz: unknown key$"):
        validate_profile(_t4_with(zzz=1), T4_SOURCE)


def test_unknown_key_set_on_the_command_line_names_the_override():
    source = ProfileSource("conf/hw/t4.yaml", ("+hw=t4", "+hw.precison=16-mixed"))
    with pytest.raises(ProfileError, match=r"command-line override '\+hw.precison=16-mixed'"):
        validate_profile(_t4_with(precison="16-mixed"), source)


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("num_workers", "four", "expected int"),
        ("num_workers", 2.5, "expected int"),
        ("pin_memory", "maybe", "expected bool"),
        ("memory_gib", "lots", "expected float or null"),
        ("batch_size", 8.5, 'expected int or "auto"'),
        ("batch_size", True, 'expected int or "auto"'),
        ("devices", None, "expected int"),
        ("name", None, "expected str"),
    ],
)
def test_wrong_type_names_the_key_and_the_expected_type(key, value, expected):
    with pytest.raises(ProfileError) as caught:
        validate_profile(_t4_with(**{key: value}), T4_SOURCE)
    assert f"hw.{key}: {expected}" in str(caught.value)
    assert "conf/hw/t4.yaml" in str(caught.value)
    assert caught.value.keys == (key,)


@pytest.mark.parametrize(
    ("changes", "key", "fragment"),
    [
        ({"precision": "16-mix"}, "precision", "did you mean '16-mixed'?"),
        ({"precision": "16"}, "precision", "is not one of"),
        ({"memory_budget_fraction": 0.0}, "memory_budget_fraction", "(0, 1]"),
        ({"memory_budget_fraction": 1.5}, "memory_budget_fraction", "(0, 1]"),
        ({"batch_size": 0}, "batch_size", "positive int"),
        ({"batch_size": "big"}, "batch_size", "positive int"),
        ({"val_batch_size": -2}, "val_batch_size", "positive int"),
        ({"num_workers": -1}, "num_workers", "≥ 0"),
        ({"accelerator": "tpu"}, "accelerator", "is not one of gpu, cpu"),
        ({"devices": 0}, "devices", "≥ 1"),
        ({"num_nodes": 0}, "num_nodes", "≥ 1"),
        ({"compute_capability": "7"}, "compute_capability", "major.minor"),
        ({"device_pattern": "(T4"}, "device_pattern", "not a valid regex"),
        ({"accumulate_grad_batches": 0}, "accumulate_grad_batches", "≥ 1"),
        ({"target_effective_batch": 0}, "target_effective_batch", "≥ 1"),
        ({"memory_gib": None}, "memory_gib", "must state its memory"),
        ({"bandwidth_gbs": -1.0}, "bandwidth_gbs", "positive"),
        ({"accelerator": "cpu", "precision": "16-mixed"}, "precision", "does not run on a CPU"),
    ],
)
def test_impossible_values_name_the_key_and_the_file(changes, key, fragment):
    with pytest.raises(ProfileError) as caught:
        validate_profile(_t4_with(**changes), T4_SOURCE)
    message = str(caught.value)
    assert f"hw.{key}:" in message
    assert fragment in message
    assert "conf/hw/t4.yaml" in message
    assert caught.value.keys == (key,)


def test_a_cpu_profile_refuses_several_nodes_naming_the_key_and_the_file():
    with pytest.raises(ProfileError) as caught:
        validate_profile({**_raw("cpu"), "num_nodes": 2}, ProfileSource("conf/hw/cpu.yaml"))
    message = str(caught.value)
    assert "hw.num_nodes: a CPU profile runs on one machine, got 2" in message
    assert "conf/hw/cpu.yaml" in message
    assert caught.value.keys == ("num_nodes",)


def test_the_world_size_and_global_batch_count_every_node():
    t4 = validate_profile(_t4_with(devices=4, num_nodes=2, batch_size=8), T4_SOURCE)
    assert t4.world_size == 8
    assert "(effective batch 64)" in describe_profile(t4)  # 8 × 4 devices × 2 nodes × 1
    assert "4× GPU × 2 nodes" in describe_profile(t4)


def test_all_problems_are_reported_together():
    with pytest.raises(ProfileError) as caught:
        validate_profile(_t4_with(precison="16-mixed", num_workers="four"), T4_SOURCE)
    assert caught.value.keys == ("num_workers", "precison")  # fields in order, then unknown keys


def test_a_profile_without_a_name_is_refused():
    raw = _raw("t4")
    del raw["name"]
    with pytest.raises(ProfileError, match=r"hw\.name: missing"):
        validate_profile(raw, T4_SOURCE)


def test_interpolations_are_resolved_before_validation():
    cfg = OmegaConf.create({"workers": 3, "hw": {**_raw("t4"), "num_workers": "${workers}"}})
    assert validate_profile(cfg.hw, T4_SOURCE).num_workers == 3


def test_describe_profile_fits_one_screen_and_says_what_matters():
    t4 = validate_profile(_raw("t4"), T4_SOURCE)
    text = describe_profile(t4.model_copy(update={"batch_size": 8, "val_batch_size": 16}))
    lines = text.splitlines()
    assert len(lines) <= 6
    assert all(len(line) <= 100 for line in lines)
    for fragment in ("t4", "16-mixed", "12.4 GiB", "8 train / 16 val", "2 workers", "compile off"):
        assert fragment in text


def test_describe_profile_of_the_cpu_profile_has_no_gpu_budget():
    cpu = validate_profile(_raw("cpu"), ProfileSource("cpu"))
    text = describe_profile(cpu)
    assert "host memory" in text
    assert "GiB" not in text
    assert "1 worker," in text


@pytest.mark.parametrize("name", SHIPPED)
def test_gpu_profiles_fit_automatically_and_allow_nothing_that_changes_the_training(name):
    profile = validate_profile(OmegaConf.load(HW_DIR / f"{name}.yaml"), ProfileSource(name))
    assert profile.fit == ("off" if profile.accelerator == "cpu" else "auto")
    assert profile.fit_allow == ()


def test_fit_and_fit_allow_mistakes_name_the_key_and_the_valid_values():
    with pytest.raises(ProfileError) as refused:
        validate_profile(_t4_with(fit="of"), T4_SOURCE)
    assert "hw.fit: 'of' is not one of auto, off; did you mean 'off'?" in str(refused.value)
    with pytest.raises(ProfileError, match=r'hw\.fit_allow: expected list of "lora"'):
        validate_profile(_t4_with(fit_allow=["lorra"]), T4_SOURCE)
    assert validate_profile(_t4_with(fit_allow=["lora"]), T4_SOURCE).fit_allow == ("lora",)
