"""Run folders: distinct for runs started in the same second, the same one for a resume."""

from __future__ import annotations

import copy
import multiprocessing
from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig, OmegaConf

from vramkit.core.run.folder import run_folder as rf
from vramkit.core.run.folder.run_folder_claim import release_claim
from vramkit.core.run.folder.run_folder_lock import LOCK_NAME
from vramkit.core.run.run_folder_guard import RANK_VARIABLES, RunFolderGuard
from vramkit.core.run.settling.compose import CONF_DIR
from vramkit.core.run.settling.resolvers import register_resolvers

NOON = 1_700_000_000.0  # one fixed second for every claim below
NO_SLURM: dict[str, str] = {}


def _new(runs_dir: Path, environ: dict[str, str] = NO_SLURM) -> Path:
    return rf.create_run_folder(rf.free_run_folder(runs_dir, NOON, environ))


def _create(named: str) -> str:
    return str(rf.create_run_folder(Path(named)))


def test_runs_started_in_the_same_second_get_distinct_folders(tmp_path):
    first = _new(tmp_path)
    second = _new(tmp_path)
    assert first != second and first.is_dir() and second.is_dir()
    assert second.name == f"{first.name}_2"


def test_naming_a_folder_creates_nothing(tmp_path):
    runs = tmp_path / "logs" / "runs"
    named = rf.free_run_folder(runs, NOON, NO_SLURM)
    assert named.parent == runs and not (tmp_path / "logs").exists()
    assert rf.free_run_folder(runs, NOON, NO_SLURM) == named, "the same name until created"


def test_eight_processes_creating_one_named_folder_at_once_get_eight_folders(tmp_path):
    # Eight runs read the config in the same second and all named the same folder: the atomic
    # mkdir gives it to one, the others the next free names.
    named = str(rf.free_run_folder(tmp_path, NOON, NO_SLURM))
    with multiprocessing.get_context("fork").Pool(8) as pool:
        folders = pool.map(_create, [named] * 8)
    assert len(set(folders)) == 8
    assert named in folders and all(Path(f).is_dir() for f in folders)


def _composed(log_dir: Path, *overrides: str) -> DictConfig:
    register_resolvers()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(
            "train", overrides=[f"paths.log_dir={log_dir}", *overrides], return_hydra_config=True
        )
    GlobalHydra.instance().clear()
    return cfg


def test_the_configured_run_dir_names_a_new_folder_per_run(tmp_path, monkeypatch):
    """hydra.run.dir of conf/hydra/default.yaml, for two runs composed in the same second: read,
    it creates nothing; once the first run created its folder, the second gets another name."""
    monkeypatch.setattr(rf.time, "time", lambda: NOON)
    first = _composed(tmp_path)
    OmegaConf.select(first, "hydra.run.dir"), OmegaConf.select(first, "hydra.sweep.dir")
    assert not (tmp_path / "text_detection").exists(), "reading the config created a folder"
    rf.create_run_folder(Path(OmegaConf.select(first, "hydra.run.dir")))
    second = _composed(tmp_path)
    dirs = [OmegaConf.select(cfg, "hydra.run.dir") for cfg in (first, second)]
    assert dirs[0] != dirs[1]
    assert all(Path(d).parent == tmp_path / "text_detection" / "runs" for d in dirs)
    assert OmegaConf.select(first, "hydra.run.dir") == dirs[0], "one folder per run"
    sweep = OmegaConf.select(first, "hydra.sweep.dir")
    job = copy.deepcopy(first)  # what Hydra's load_sweep_config gives every job, cache included
    OmegaConf.copy_cache(from_config=first, to_config=job)
    assert OmegaConf.select(job, "hydra.sweep.dir") == sweep, "every job shares the sweep folder"

    run = Path(dirs[0])
    (run / "checkpoints").mkdir(parents=True)
    (run / rf.RUN_CONFIG).write_text("{}")
    resumed = _composed(tmp_path, f"ckpt_path={run / 'checkpoints' / 'last.ckpt'}")
    assert OmegaConf.select(resumed, "hydra.run.dir") == str(run), "a resume writes into its run"


def test_a_checkpoint_outside_a_run_folder_gets_a_new_folder(tmp_path):
    (tmp_path / "checkpoints").mkdir()
    assert rf.folder_of_checkpoint(tmp_path / "checkpoints" / "last.ckpt") is None
    assert rf.folder_of_checkpoint(tmp_path / "last.ckpt") is None


def test_a_requeued_slurm_job_gets_its_folder_back(tmp_path):
    job = {"SLURM_JOB_ID": "4242"}
    first = _new(tmp_path, job)
    assert first.name == "slurm-4242"
    assert _new(tmp_path, job).name == "slurm-4242_2", "a second run"
    requeued = rf.free_run_folder(tmp_path, NOON, {**job, "SLURM_RESTART_COUNT": "1"})
    assert requeued == first
    array = {"SLURM_ARRAY_JOB_ID": "7", "SLURM_ARRAY_TASK_ID": "3", "SLURM_JOB_ID": "9"}
    assert _new(tmp_path, array).name == "slurm-7_3"


def test_a_resumed_run_keeps_the_first_runs_records(tmp_path):
    assert rf.record_name(tmp_path, "resolved_config.yaml") == "resolved_config.yaml"
    (tmp_path / "resolved_config.yaml").write_text("{}")
    (tmp_path / ".hydra").mkdir()
    assert rf.record_name(tmp_path, "resolved_config.yaml") == "resolved_config.resume_1.yaml"
    assert rf.record_name(tmp_path, ".hydra") == ".hydra.resume_1"
    (tmp_path / "resolved_config.resume_1.yaml").write_text("{}")
    assert rf.record_name(tmp_path, "resolved_config.yaml") == "resolved_config.resume_2.yaml"


def test_the_guard_creates_the_named_folder_or_the_next_when_another_run_took_it(
    tmp_path, monkeypatch
):
    """Two runs read their config in the same second (one name); the guard creates the folder,
    and the run that finds it taken writes the next name where Hydra reads it."""
    for name in RANK_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(rf.time, "time", lambda: NOON)
    first, second = _composed(tmp_path), _composed(tmp_path)
    named = Path(OmegaConf.select(first, "hydra.run.dir"))
    assert OmegaConf.select(second, "hydra.run.dir") == str(named) and not named.exists()
    try:
        RunFolderGuard().on_run_start(first)
        RunFolderGuard().on_run_start(second)
        assert OmegaConf.select(first, "hydra.run.dir") == str(named) and named.is_dir()
        assert OmegaConf.select(second, "hydra.run.dir") == f"{named}_2"
        assert (Path(f"{named}_2") / LOCK_NAME).is_file(), "created, then locked"

        sweeps = [_composed(tmp_path, "hydra.mode=MULTIRUN") for _ in range(2)]
        sweep = OmegaConf.select(sweeps[0], "hydra.sweep.dir")  # both read before either starts
        assert OmegaConf.select(sweeps[1], "hydra.sweep.dir") == sweep
        RunFolderGuard().on_multirun_start(sweeps[0])
        RunFolderGuard().on_multirun_start(sweeps[1])
        assert OmegaConf.select(sweeps[1], "hydra.sweep.dir") == f"{sweep}_2"
        # Hydra composes each job's config from these overrides (load_sweep_config)
        assert f"hydra.sweep.dir='{sweep}_2'" in sweeps[1].hydra.overrides.hydra
    finally:
        release_claim()


def test_a_folder_the_user_gave_is_not_renamed(tmp_path, monkeypatch):
    for name in RANK_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    given = tmp_path / "mine"
    cfg = _composed(tmp_path, f"hydra.run.dir={given}")
    try:
        RunFolderGuard().on_run_start(cfg)
        assert OmegaConf.select(cfg, "hydra.run.dir") == str(given) and given.is_dir()
    finally:
        release_claim()
