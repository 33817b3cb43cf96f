"""logger=tensorboard and logger=mlflow keep CSV beside them and the same metric names."""

from __future__ import annotations

from pathlib import Path

import pytest

from vramkit.core.config.instantiate import instantiate_group

METRICS = {"train/loss": 1.5, "val/hmean": 0.25, "mem/train_peak_gib": 0.5, "lr-AdamW": 1e-3}


def _log_with(cfg) -> Path:
    for logger in instantiate_group(cfg.logger):
        logger.log_metrics(METRICS, step=3)
        logger.finalize("success")
    return Path(cfg.paths.output_dir)


def _csv_names(run: Path) -> set[str]:
    (path,) = run.glob("csv/version_*/metrics.csv")
    return set(path.read_text().splitlines()[0].split(",")) - {"step"}


def test_tensorboard_beside_csv_with_the_same_names(compose_config):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = _log_with(compose_config("logger=tensorboard"))
    assert _csv_names(run) == set(METRICS)
    events = EventAccumulator(str(run / "tensorboard"))
    events.Reload()
    assert set(events.Tags()["scalars"]) == set(METRICS)


@pytest.mark.slow  # MLflow creates its SQLite tables (alembic migrations): about 20 s
def test_mlflow_local_store_in_the_run_folder_with_the_same_names(compose_config):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    run = _log_with(compose_config("logger=mlflow"))
    assert _csv_names(run) == set(METRICS)
    client = MlflowClient(f"sqlite:///{run / 'mlflow.db'}")
    experiments = [e.experiment_id for e in client.search_experiments()]
    (logged,) = client.search_runs(experiments)
    assert set(logged.data.metrics) == set(METRICS)
    assert not Path("mlruns").exists()  # nothing written outside the run folder
