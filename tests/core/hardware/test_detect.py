"""Probing the device and picking the profile that describes it."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from vramkit.core.hardware import detect
from vramkit.core.hardware.detect import (
    DeviceInfo,
    cudnn_version_text,
    detect_profile,
    generic_profile,
    load_profile_file,
    nvidia_driver_version,
    probe_device,
    usable_cpu_count,
)
from vramkit.core.hardware.profile import ProfileError, ProfileSource, validate_profile

REPO = Path(__file__).resolve().parents[3]
HW_DIR = REPO / "conf" / "hw"


def gpu(name: str, memory_gib: float, capability: tuple[int, int]) -> DeviceInfo:
    return DeviceInfo("cuda", name, memory_gib, capability, count=1, cpu_count=8)


CPU = DeviceInfo("cpu", "CPU", 16.0, None, count=0, cpu_count=2)


@pytest.mark.parametrize(
    ("device", "expected"),
    [
        (gpu("Tesla T4", 14.57, (7, 5)), "t4"),
        (gpu("NVIDIA GeForce RTX 4090 Laptop GPU", 15.99, (8, 9)), "rtx4090_laptop"),
        (gpu("NVIDIA GeForce RTX 4090 Laptop GPU", 15.6, (8, 9)), "rtx4090_laptop"),
        (gpu("NVIDIA GeForce RTX 2060 SUPER", 7.79, (7, 5)), "rtx2060_super"),
        (gpu("NVIDIA L4", 22.03, (8, 9)), "l4"),
        (gpu("NVIDIA A100-SXM4-40GB", 39.39, (8, 0)), "a100_40gb"),
        (gpu("NVIDIA A100-PCIE-40GB", 39.39, (8, 0)), "a100_40gb"),
        (gpu("NVIDIA H100 80GB HBM3", 79.19, (9, 0)), "h100_80gb"),
        (CPU, "cpu"),
    ],
)
def test_detection_picks_the_profile_by_name_and_memory(device, expected):
    detection = detect_profile(device, HW_DIR, display_root=REPO)
    assert detection.profile.name == expected
    assert detection.raw.name == expected
    assert detection.source.file == f"conf/hw/{expected}.yaml"
    assert f"conf/hw/{expected}.yaml" in detection.reason


@pytest.mark.parametrize(
    ("device", "precision", "compile_"),
    [
        (gpu("NVIDIA RTX A2000", 5.79, (8, 6)), "bf16-mixed", True),
        (gpu("NVIDIA A100-SXM4-80GB", 79.15, (8, 0)), "bf16-mixed", True),
        (gpu("NVIDIA H100 PCIe", 79.19, (9, 0)), "bf16-mixed", True),
        (gpu("NVIDIA GeForce RTX 4090", 23.99, (8, 9)), "bf16-mixed", True),
        (gpu("NVIDIA GeForce RTX 2060", 5.79, (7, 5)), "16-mixed", False),
        (gpu("NVIDIA GeForce GTX 1080 Ti", 10.91, (6, 1)), "32-true", False),
    ],
)
def test_an_unknown_gpu_gets_a_generic_profile_from_its_properties(device, precision, compile_):
    detection = detect_profile(device, HW_DIR, display_root=REPO)
    profile = detection.profile
    assert profile.name == "generic"
    assert profile.display_name == device.name
    assert profile.memory_gib == pytest.approx(device.memory_gib, abs=0.01)
    assert profile.precision == precision
    assert profile.compile is compile_
    assert profile.bf16 is (device.capability >= (8, 0))
    # NHWC where tensor cores serve it (sm_70+); the GTX 1080 Ti keeps NCHW
    assert profile.channels_last is (device.capability >= (7, 0))
    assert "generic profile" in detection.reason
    # the raw values placed under cfg.hw pass the schema like any profile file
    assert validate_profile(detection.raw, detection.source) == profile


def test_a_named_card_with_the_wrong_memory_says_which_profile_it_resembled():
    detection = detect_profile(
        gpu("NVIDIA A100-SXM4-80GB", 79.15, (8, 0)), HW_DIR, display_root=REPO
    )
    assert "a100_40gb" in detection.reason
    assert "79.2 GiB" in detection.reason


def test_generic_profile_caps_workers_to_the_cpus():
    device = dataclasses.replace(gpu("NVIDIA RTX A2000", 5.79, (8, 6)), cpu_count=2)
    assert generic_profile(device).num_workers == 2


def test_an_invalid_profile_file_stops_detection_and_is_named(tmp_path):
    (tmp_path / "t4.yaml").write_text((HW_DIR / "t4.yaml").read_text())
    (tmp_path / "mine.yaml").write_text("name: mine\naccelerator: gpu\nprecision: 16-mixd\n")
    with pytest.raises(ProfileError, match=r"mine\.yaml") as caught:
        detect_profile(gpu("Tesla T4", 14.57, (7, 5)), tmp_path, display_root=tmp_path.parent)
    assert "did you mean '16-mixed'?" in str(caught.value)


def test_broken_yaml_names_the_file_and_line(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("name: bad\nprecision: [16-mixed\n")
    with pytest.raises(ProfileError, match=r"(?s)bad\.yaml: not valid YAML.*line 2"):
        load_profile_file(path, display_root=tmp_path)


def test_a_missing_profile_file_is_named(tmp_path):
    with pytest.raises(ProfileError, match=r"cpu\.yaml: no such hardware profile file"):
        detect_profile(CPU, tmp_path, display_root=tmp_path)


def test_device_bf16_means_native_bf16():
    assert gpu("NVIDIA L4", 22.0, (8, 9)).bf16
    assert not gpu("Tesla T4", 14.57, (7, 5)).bf16
    assert not CPU.bf16


def test_device_description_for_messages():
    assert CPU.describe() == "no CUDA device; CPU with 2 cores"
    t4 = dataclasses.replace(gpu("Tesla T4", 14.57, (7, 5)), count=2)
    assert t4.describe() == "Tesla T4, 14.6 GiB, compute capability 7.5, 2 devices"


def test_probe_without_cuda_touches_nothing_beyond_is_available(monkeypatch):
    # A machine where torch sees no CUDA device, on either build: is_available() answers False
    # (on a CUDA build torch's own is_available may count devices; that is its business).
    def forbidden(*args, **kwargs):
        raise AssertionError("CUDA queried on a CPU-only machine")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "get_device_properties", forbidden)
    monkeypatch.setattr(torch.cuda, "device_count", forbidden)
    monkeypatch.setattr(torch.backends.cudnn, "version", forbidden)
    monkeypatch.setattr(detect, "nvidia_driver_version", forbidden)
    device = probe_device()
    assert device.kind == "cpu"
    assert device.count == 0
    assert device.capability is None
    assert device.cpu_count == usable_cpu_count()
    assert device.memory_gib > 0
    assert not torch.cuda.is_initialized()


def fake_cuda_software(monkeypatch) -> str:
    """The driver, runtime and cuDNN a T4 machine might report, on either build of torch."""
    monkeypatch.setattr(detect, "nvidia_driver_version", lambda: "550.54.15")
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    monkeypatch.setattr(torch.backends.cudnn, "version", lambda: 91002)
    return "driver 550.54.15, CUDA runtime 12.8, cuDNN 9.10.2"


def test_probe_reads_cuda_device_zero(monkeypatch):
    properties = SimpleNamespace(name="Tesla T4", total_memory=15_642_329_088, major=7, minor=5)
    asked = []
    software = fake_cuda_software(monkeypatch)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(
        torch.cuda, "get_device_properties", lambda index: asked.append(index) or properties
    )
    device = probe_device()
    assert asked == [0]
    assert device == DeviceInfo(
        kind="cuda",
        name="Tesla T4",
        memory_gib=15_642_329_088 / 2**30,
        capability=(7, 5),
        count=2,
        cpu_count=usable_cpu_count(),
        software=software,
    )
    detection = detect_profile(device, HW_DIR, display_root=REPO)
    assert detection.profile.name == "t4"
    assert detection.reason.endswith(f"(conf/hw/t4.yaml); {software}")
    assert device.describe().endswith(f"2 devices; {software}")


@pytest.mark.parametrize(
    ("version", "text"), [(92400, "9.24.0"), (91002, "9.10.2"), (8907, "8.9.7"), (None, "none")]
)
def test_cudnn_versions_read_as_released(version, text):
    assert cudnn_version_text(version) == text


def test_the_driver_version_is_none_where_nvml_does_not_answer(monkeypatch):
    def no_library(name):
        raise OSError(f"{name}: cannot open shared object file")

    monkeypatch.setattr(detect.ctypes, "CDLL", no_library)
    assert nvidia_driver_version() is None


def test_profile_source_in_detection_is_the_file():
    detection = detect_profile(CPU, HW_DIR, display_root=REPO)
    assert detection.source == ProfileSource("conf/hw/cpu.yaml")
