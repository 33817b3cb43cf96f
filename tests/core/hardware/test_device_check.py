"""A profile against the device: refusal, rehearsal mapping and the memory cap."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from vramkit.core.hardware.detect import DeviceInfo, load_profile_file
from vramkit.core.hardware.device_check import (
    HardwareMismatchError,
    apply_memory_cap,
    check_memory_budget,
    check_profile,
    fit_to_device,
)
from vramkit.core.hardware.memory_stats import HostLimit
from vramkit.core.hardware.profile import HardwareProfile, ProfileError, ProfileSource
from vramkit.core.units import GIB

REPO = Path(__file__).resolve().parents[3]
CPU_2 = DeviceInfo("cpu", "CPU", 16.0, None, count=0, cpu_count=2)
T4 = DeviceInfo("cuda", "Tesla T4", 14.57, (7, 5), count=1, cpu_count=2)
RTX2060S = DeviceInfo("cuda", "NVIDIA GeForce RTX 2060 SUPER", 7.79, (7, 5), count=1, cpu_count=8)
LAPTOP_4090 = DeviceInfo("cuda", "NVIDIA GeForce RTX 4090 Laptop GPU", 15.99, (8, 9), 1, 16)
V100_32 = DeviceInfo("cuda", "Tesla V100-SXM2-32GB", 31.74, (7, 0), count=1, cpu_count=8)
H100 = DeviceInfo("cuda", "NVIDIA H100 80GB HBM3", 79.19, (9, 0), count=1, cpu_count=16)


def load(name: str, **changes: object) -> tuple[HardwareProfile, ProfileSource]:
    found = load_profile_file(REPO / "conf" / "hw" / f"{name}.yaml", display_root=REPO)
    return found.profile.model_copy(update=changes), found.source


def test_gpu_profile_on_a_cpu_machine_is_refused_with_one_clear_message():
    t4, source = load("t4")
    with pytest.raises(HardwareMismatchError) as caught:
        check_profile(t4, CPU_2, source=source)
    message = str(caught.value)
    assert "hardware profile 't4' (conf/hw/t4.yaml)" in message
    assert "expected: NVIDIA T4, 14.6 GiB, compute capability 7.5" in message
    assert "found:    no CUDA device; CPU with 2 cores" in message
    assert "omit +hw=t4" in message
    assert "add hw.strict=false" in message
    mapping_line = next(line for line in message.splitlines() if "hw.strict=false" in line)
    assert "precision 16-mixed → 32-true" in mapping_line
    assert "accelerator gpu → cpu" in mapping_line


def test_strict_false_maps_a_gpu_profile_to_the_cpu():
    t4, source = load("t4", strict=False, batch_size=12, val_batch_size=24)
    fit = check_profile(t4, CPU_2, source=source)
    mapped = fit.profile
    assert (mapped.accelerator, mapped.precision) == ("cpu", "32-true")
    assert (mapped.pin_memory, mapped.compile) == (False, False)
    assert (mapped.batch_size, mapped.val_batch_size) == (12, 24)
    assert mapped.num_workers == 2
    assert fit.problems == ("no CUDA device",)
    assert "batch sizes kept" in fit.mapping()


def test_strict_false_prefers_32_true_over_slow_cpu_bf16_and_caps_workers():
    laptop, source = load("rtx4090_laptop", strict=False)
    fit = check_profile(laptop, CPU_2, source=source)
    assert fit.profile.precision == "32-true"
    assert fit.profile.num_workers == 2
    assert fit.profile.compile is False
    assert "bf16-mixed → 32-true (bf16 runs on CPU but slowly)" in fit.mapping()
    assert "num_workers 4 → 2" in fit.mapping()


def test_cpu_profile_runs_anywhere_unchanged():
    cpu, source = load("cpu")
    for device in (CPU_2, H100):
        fit = check_profile(cpu, device, source=source)
        assert fit.profile == cpu
        assert fit.problems == ()
        assert fit.memory_cap is None


def test_the_card_the_profile_describes_fits_without_a_cap():
    laptop, source = load("rtx4090_laptop")
    fit = check_profile(laptop, LAPTOP_4090, source=source)
    assert fit.profile == laptop
    assert (fit.problems, fit.changes, fit.memory_cap) == ((), (), None)


def test_a_larger_gpu_runs_capped_to_the_profiles_memory():
    t4, source = load("t4")
    fit = check_profile(t4, H100, source=source)
    assert fit.problems == ()
    assert fit.profile == t4
    assert fit.memory_cap == pytest.approx(14.6 / 79.19)


def test_a_smaller_gpu_is_refused_because_the_plan_would_run_out_of_memory():
    t4, source = load("t4")
    with pytest.raises(HardwareMismatchError) as caught:
        check_profile(t4, RTX2060S, source=source)
    message = str(caught.value)
    assert "found:    NVIDIA GeForce RTX 2060 SUPER, 7.8 GiB" in message
    assert "7.8 GiB is less than the 14.6 GiB" in message
    assert "run out of memory" in message
    assert "hw.strict=false" in message


def test_a_smaller_gpu_without_strict_keeps_the_settings_and_says_they_may_not_fit():
    t4, source = load("t4", strict=False)
    fit = check_profile(t4, RTX2060S, source=source)
    assert fit.profile == t4
    assert fit.changes == ()
    assert "may not fit in 7.8 GiB" in fit.mapping()


def test_bf16_on_a_gpu_without_bf16_is_refused_when_strict():
    l4, source = load("l4")
    with pytest.raises(HardwareMismatchError, match="bf16-mixed needs native bf16"):
        check_profile(l4, V100_32, source=source)


@pytest.mark.parametrize(
    ("asked", "mapped"), [("bf16-mixed", "16-mixed"), ("bf16-true", "16-true")]
)
def test_bf16_on_a_gpu_without_bf16_maps_to_fp16_without_strict(asked, mapped):
    l4, source = load("l4", precision=asked, strict=False)
    fit = check_profile(l4, V100_32, source=source)
    assert fit.profile.precision == mapped
    assert fit.memory_cap == pytest.approx(22.0 / 31.74)


def test_more_devices_than_the_machine_has():
    t4, source = load("t4", devices=2)
    with pytest.raises(HardwareMismatchError, match="uses 2 GPUs, this machine has 1"):
        check_profile(t4, T4, source=source)
    assert fit_to_device(t4.model_copy(update={"strict": False}), T4).profile.devices == 1


def test_a_detected_profile_offers_the_plus_form_of_strict():
    t4, source = load("t4", precision="bf16-mixed")
    with pytest.raises(HardwareMismatchError) as caught:
        check_profile(t4, T4, source=source, detected=True)
    assert "+hw.strict=false" in str(caught.value)
    assert "omit +hw" not in str(caught.value)


@pytest.fixture
def fake_cuda(monkeypatch):
    """torch.cuda as on a CUDA machine, recording set_per_process_memory_fraction calls."""
    calls = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(
        torch.cuda,
        "set_per_process_memory_fraction",
        lambda fraction, device=None: calls.append((fraction, device)),
    )
    return calls


def test_memory_cap_is_the_profiles_share_of_the_device(fake_cuda):
    t4, _ = load("t4")
    assert apply_memory_cap(t4, H100) == pytest.approx(0.18437, abs=1e-5)
    assert fake_cuda == [(pytest.approx(14.6 / 79.19), 0)]


def test_memory_cap_applies_to_every_device_the_run_uses(fake_cuda):
    t4, _ = load("t4", devices=2)
    apply_memory_cap(t4, dataclasses.replace(H100, count=4))
    assert [device for _, device in fake_cuda] == [0, 1]


def test_memory_cap_is_skipped_when_it_would_not_shrink_anything(fake_cuda):
    h100, _ = load("h100_80gb")
    cpu, _ = load("cpu")
    t4, _ = load("t4")
    assert apply_memory_cap(h100, T4) is None
    assert apply_memory_cap(cpu, H100) is None
    assert apply_memory_cap(t4, CPU_2) is None
    assert fake_cuda == []


def test_memory_cap_is_skipped_without_cuda(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", lambda *a: calls.append(a))
    t4, _ = load("t4")
    assert apply_memory_cap(t4, H100) is None
    assert calls == []


HOST_23 = HostLimit(int(23.4 * GIB), "MemTotal 23.40 GiB")


def test_a_cpu_budget_above_the_hosts_memory_is_refused_in_one_line():
    # The drill: +hw=cpu hw.memory_gib=500 on a 23 GiB host planned 57 GiB, "fits".
    cpu, _ = load("cpu", memory_gib=500.0)
    source = ProfileSource("conf/hw/cpu.yaml", ("hw.memory_gib=500",))
    with pytest.raises(ProfileError) as refused:
        check_memory_budget(cpu, CPU_2, source=source, host=HOST_23)
    assert str(refused.value) == (
        "hw.memory_gib=500 (conf/hw/cpu.yaml; command-line override 'hw.memory_gib=500') is more "
        "than this host's memory (MemTotal 23.40 GiB): state at most 23.4, or leave it null to "
        "plan within what the host has free"
    )
    assert refused.value.keys == ("memory_gib",)
    within, _ = load("cpu", memory_gib=23.0)
    check_memory_budget(within, CPU_2, source=source, host=HOST_23)


def test_a_gpu_budget_above_the_cards_memory_set_on_the_command_line_is_refused():
    t4, _ = load("t4", memory_gib=80.0)
    source = ProfileSource("conf/hw/t4.yaml", ("hw.memory_gib=80",))
    with pytest.raises(ProfileError) as refused:
        check_memory_budget(t4, T4, source=source)
    assert "\n" not in str(refused.value)
    assert str(refused.value).startswith("hw.memory_gib=80 (conf/hw/t4.yaml; command-line")
    assert "more than this GPU's memory (Tesla T4, 14.6 GiB): state at most 14.6" in str(
        refused.value
    )
    # The profile file's own memory on another card is check_profile's mismatch, not this.
    h100, h100_source = load("h100_80gb")
    check_memory_budget(h100, T4, source=h100_source)
    # Within the card's reported memory (ECC, drivers): accepted.
    t4_stated, _ = load("t4", memory_gib=14.8)
    check_memory_budget(t4_stated, T4, source=ProfileSource("x", ("hw.memory_gib=14.8",)))
