"""The composed config is the run: `${resolved_hw:…}` previews exactly what a run settles."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from vramkit.core.hardware.detect import DeviceInfo
from vramkit.core.run import resolvers
from vramkit.core.run.compose import CONF_DIR, REPO_ROOT
from vramkit.core.run.resolve_hardware import resolve_hardware

T4 = DeviceInfo("cuda", "Tesla T4", 14.57, (7, 5), count=1, cpu_count=2)
RUN_KEYS = (
    ("data", "batch_size"),
    ("data", "val_batch_size"),
    ("data", "num_workers"),
    ("trainer", "precision"),
    ("trainer", "accumulate_grad_batches"),
    ("model", "compile"),
)


def _run_values(values: dict) -> dict[str, object]:
    return {f"{group}.{key}": values[group][key] for group, key in RUN_KEYS}


def test_the_preview_of_a_t4_run_is_what_the_run_settles(compose_config):
    preview = _run_values(
        OmegaConf.to_container(compose_config("+hw=t4", "debug=smoke"), resolve=True)
    )
    assert preview["data.batch_size"] == 16  # all 16 smoke images fit: searched, not "auto"
    assert preview["data.val_batch_size"] == 4
    assert preview["trainer.precision"] == "16-mixed"

    cfg = compose_config("+hw=t4", "debug=smoke")
    resolve_hardware(cfg, conf_dir=CONF_DIR, device=T4)  # what train() does on a T4
    assert _run_values(OmegaConf.to_container(cfg, resolve=True)) == preview


def test_a_settled_config_reads_its_hw_node_and_plans_nothing_more(compose_config, monkeypatch):
    cfg = compose_config("+hw=cpu", "hw.batch_size=3", "hw.val_batch_size=5")
    resolve_hardware(cfg, conf_dir=CONF_DIR)

    def refuse(root):
        raise AssertionError("a settled config must not be previewed")

    monkeypatch.setattr(resolvers, "_preview", refuse)
    assert (cfg.data.batch_size, cfg.data.val_batch_size) == (3, 5)
    assert cfg.trainer.precision == "32-true"


def test_composition_alone_never_plans(compose_config, monkeypatch):
    # debug=smoke overrides data.num_workers, so the merge peeks at the interpolation it replaces
    # before +hw is merged: that must not plan (nor detect) anything.
    def refuse(root):
        raise AssertionError("composition must not preview the profile")

    monkeypatch.setattr(resolvers, "_preview", refuse)
    cfg = compose_config("+hw=t4", "debug=smoke")
    assert cfg.data.num_workers == 0


def test_an_unknown_profile_field_is_refused(compose_config):
    cfg = compose_config("+hw=cpu")
    cfg.data.num_workers = "${resolved_hw:num_worker}"
    with pytest.raises(Exception, match="unknown hardware profile field 'num_worker'"):
        _ = cfg.data.num_workers


def test_project_root_is_the_repository_unless_the_environment_moves_it(monkeypatch, tmp_path):
    monkeypatch.delenv("PROJECT_ROOT", raising=False)
    assert Path(resolvers.project_root()) == REPO_ROOT
    assert (REPO_ROOT / "conf" / "train.yaml").is_file()
    monkeypatch.setenv("PROJECT_ROOT", str(tmp_path))
    assert resolvers.project_root() == str(tmp_path)


@pytest.mark.slow
def test_cfg_job_resolve_prints_the_values_of_the_run(tmp_path):
    command = [
        sys.executable,
        "train.py",
        "+hw=t4",
        "debug=smoke",
        f"paths.data_dir={tmp_path}",
        "--cfg",
        "job",
        "--resolve",
    ]
    result = subprocess.run(
        command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=300, check=True
    )
    values = _run_values(yaml.safe_load(result.stdout))
    assert values == {
        "data.batch_size": 16,
        "data.val_batch_size": 4,
        "data.num_workers": 0,  # debug=smoke's, over the profile's 2
        "trainer.precision": "16-mixed",
        "trainer.accumulate_grad_batches": 1,
        "model.compile": False,
    }
