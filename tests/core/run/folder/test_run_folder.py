"""Run folders: distinct for runs started in the same second, the same one for a resume."""

from __future__ import annotations

import copy
import multiprocessing
from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig, OmegaConf

from vramkit.core.run.folder import run_folder as rf
from vramkit.core.run.settling.compose import CONF_DIR
from vramkit.core.run.settling.resolvers import register_resolvers

NOON = 1_700_000_000.0  # one fixed second for every claim below
NO_SLURM: dict[str, str] = {}


def _claim(runs_dir: str) -> str:
    return str(rf.claim_run_folder(Path(runs_dir), NOON, NO_SLURM))


def test_runs_started_in_the_same_second_get_distinct_folders(tmp_path):
    first = rf.claim_run_folder(tmp_path, NOON, NO_SLURM)
    second = rf.claim_run_folder(tmp_path, NOON, NO_SLURM)
    assert first != second and first.is_dir() and second.is_dir()
    assert second.name == f"{first.name}_2"


def test_eight_processes_claiming_at_once_get_eight_folders(tmp_path):
    with multiprocessing.get_context("fork").Pool(8) as pool:
        folders = pool.map(_claim, [str(tmp_path)] * 8)
    assert len(set(folders)) == 8


def _composed(log_dir: Path, *overrides: str) -> DictConfig:
    register_resolvers()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(
            "train", overrides=[f"paths.log_dir={log_dir}", *overrides], return_hydra_config=True
        )
    GlobalHydra.instance().clear()
    return cfg


def test_the_configured_run_dir_claims_a_new_folder_per_run(tmp_path, monkeypatch):
    """hydra.run.dir of conf/hydra/default.yaml, for two runs composed in the same second."""
    monkeypatch.setattr(rf.time, "time", lambda: NOON)
    first, second = _composed(tmp_path), _composed(tmp_path)
    dirs = [OmegaConf.select(cfg, "hydra.run.dir") for cfg in (first, second)]
    assert dirs[0] != dirs[1]
    assert all(Path(d).parent == tmp_path / "text_detection" / "runs" for d in dirs)
    assert OmegaConf.select(first, "hydra.run.dir") == dirs[0], "one folder per run"
    sweep = OmegaConf.select(first, "hydra.sweep.dir")
    job = copy.deepcopy(first)  # what Hydra's load_sweep_config gives every job, cache included
    OmegaConf.copy_cache(from_config=first, to_config=job)
    assert OmegaConf.select(job, "hydra.sweep.dir") == sweep, "every job shares the sweep folder"

    run = Path(dirs[0])
    (run / "checkpoints").mkdir()
    (run / rf.RUN_CONFIG).write_text("{}")
    resumed = _composed(tmp_path, f"ckpt_path={run / 'checkpoints' / 'last.ckpt'}")
    assert OmegaConf.select(resumed, "hydra.run.dir") == str(run), "a resume writes into its run"


def test_a_checkpoint_outside_a_run_folder_gets_a_new_folder(tmp_path):
    (tmp_path / "checkpoints").mkdir()
    assert rf.folder_of_checkpoint(tmp_path / "checkpoints" / "last.ckpt") is None
    assert rf.folder_of_checkpoint(tmp_path / "last.ckpt") is None


def test_a_requeued_slurm_job_gets_its_folder_back(tmp_path):
    job = {"SLURM_JOB_ID": "4242"}
    first = rf.claim_run_folder(tmp_path, NOON, job)
    assert first.name == "slurm-4242"
    assert rf.claim_run_folder(tmp_path, NOON, job).name == "slurm-4242_2", "a second run"
    requeued = rf.claim_run_folder(tmp_path, NOON, {**job, "SLURM_RESTART_COUNT": "1"})
    assert requeued == first
    array = {"SLURM_ARRAY_JOB_ID": "7", "SLURM_ARRAY_TASK_ID": "3", "SLURM_JOB_ID": "9"}
    assert rf.claim_run_folder(tmp_path, NOON, array).name == "slurm-7_3"


def test_a_resumed_run_keeps_the_first_runs_records(tmp_path):
    assert rf.record_name(tmp_path, "resolved_config.yaml") == "resolved_config.yaml"
    (tmp_path / "resolved_config.yaml").write_text("{}")
    (tmp_path / ".hydra").mkdir()
    assert rf.record_name(tmp_path, "resolved_config.yaml") == "resolved_config.resume_1.yaml"
    assert rf.record_name(tmp_path, ".hydra") == ".hydra.resume_1"
    (tmp_path / "resolved_config.resume_1.yaml").write_text("{}")
    assert rf.record_name(tmp_path, "resolved_config.yaml") == "resolved_config.resume_2.yaml"
