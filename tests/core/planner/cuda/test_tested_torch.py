"""The tested torch range: one string in pyproject.toml and the planner, and what a plan says."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import tomllib
import torch
from packaging.requirements import Requirement
from packaging.version import Version

from vramkit.core.planner.cuda import tested_torch
from vramkit.core.planner.cuda.tested_torch import (
    NEWEST_TESTED_TORCH,
    TESTED_TORCH,
    modelled_torch,
    torch_build,
    untested_torch_warning,
)

REPO = Path(__file__).resolve().parents[4]


def torch_requirement() -> Requirement:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    (torch_line,) = [line for line in project["dependencies"] if Requirement(line).name == "torch"]
    return Requirement(torch_line)


def test_pip_is_given_the_range_the_planner_checks():
    assert str(torch_requirement().specifier) == str(Requirement(f"torch{TESTED_TORCH}").specifier)


def test_the_makefile_installs_tested_releases_only():
    makefile = (REPO / "Makefile").read_text()
    (spec,) = re.findall(r"^TORCH_SPEC \?= \$\(if \$\(HAS_NVIDIA\),(\S+),(\S+)\)$", makefile, re.M)
    gpu, cpu = (Requirement(part) for part in spec)
    assert str(gpu.specifier) == f"=={NEWEST_TESTED_TORCH}"  # never "the newest"
    specifier = torch_requirement().specifier
    for requirement in (gpu, cpu):
        (pinned,) = requirement.specifier
        assert pinned.operator == "==" and Version(pinned.version) in specifier


@pytest.mark.parametrize("version", ["2.12.1", "2.15.0", "2.14.0a0+git1234", "2.15.0.dev20260601"])
def test_pip_and_the_plan_refuse_the_same_versions(version):
    assert not torch_requirement().specifier.contains(version, prereleases=False)
    warning = untested_torch_warning(version)
    assert warning is not None and f"torch {version} is outside the tested range" in warning
    assert "\n" not in warning


@pytest.mark.parametrize("version", ["2.13.0+cpu", "2.14.1+cu130", torch.__version__])
def test_tested_releases_of_either_build_plan_without_a_warning(version):
    assert untested_torch_warning(version) is None


def test_the_plan_names_the_build_whose_rules_it_applied(monkeypatch):
    monkeypatch.setattr(torch, "__version__", "2.14.1+cu130")
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    assert tested_torch.is_cuda_build() and torch_build() == "CUDA 13.0 build"
    assert modelled_torch() == "CUDA rules of torch 2.14.1+cu130 (autocast lists read from it)"
    monkeypatch.setattr(torch, "__version__", "2.13.0+cpu")
    monkeypatch.setattr(torch.version, "cuda", None)
    assert torch_build() == "CPU build"
    assert modelled_torch() == (
        "CUDA rules of torch 2.13's CUDA build (autocast lists from vramkit's table)"
    )
