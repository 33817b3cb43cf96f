"""experiment=phi15_coherence_tiny as one multirun: 6 conditions, each logs accuracy, ECE, Brier."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("transformers", reason="task=text_classification needs `transformers`")

from omegaconf import OmegaConf

from tests.e2e.script_runs import REPO, run_script
from vramkit.core.run.records.multirun_report import report_multirun
from vramkit.tasks.text_classification.module import TextClassificationModule

CONDITIONS = ["ce_only", "coherence", "no_stability", "no_center", "no_separation", "no_brier"]


@pytest.mark.slow
def test_the_tiny_coherence_experiment_runs_every_condition(tmp_path, shared_data_dir):
    # The experiment's own sweep, shortened: one seed, a few steps, no checkpoints.
    overrides = [
        "-m",
        "experiment=phi15_coherence_tiny",
        "+hw=cpu",
        "logger=csv",
        "callbacks=none",
        "seed=0",
        "trainer.max_epochs=1",
        "+trainer.limit_train_batches=2",
        "+trainer.limit_val_batches=1",
        "trainer.log_every_n_steps=1",
        f"paths.log_dir={tmp_path}",
        f"paths.data_dir={shared_data_dir}",  # the toy sentences under pytest's tmp paths
    ]
    completed = run_script("train.py", *overrides, cwd=REPO, timeout_s=120)
    assert completed.returncode == 0, completed.stderr[-3000:]
    (sweep,) = tmp_path.glob("text_classification/multiruns/*")
    summary = json.loads((sweep / "multirun_summary.json").read_text())
    assert [job["status"] for job in summary["jobs"]] == ["completed"] * len(CONDITIONS)
    report = report_multirun(sweep, metrics=["val/accuracy", "val/ece", "val/brier"])
    assert [c["condition"] for c in report["conditions"]] == [f"condition={c}" for c in CONDITIONS]
    for condition in report["conditions"]:
        for name in ("val/accuracy", "val/ece", "val/brier"):
            stats = condition["metrics"][name]
            assert stats["n"] == 1 and 0.0 <= stats["mean"] <= 2.0, (condition, name)
    # The coherence terms are logged, and a removed term is not.
    logs = {
        c: (sweep / str(i) / "csv" / "version_0" / "metrics.csv").read_text().splitlines()[0]
        for i, c in enumerate(CONDITIONS)
    }
    assert "train/loss_separation" in logs["coherence"]
    assert "train/loss_separation" not in logs["no_separation"]
    assert "train/loss_ce" not in logs["ce_only"]
    # ... and every name is one the module declares, which monitors are checked against
    declared = TextClassificationModule.logged_metrics(OmegaConf.create({"coherence": {}}))
    for header in logs.values():
        logged = {name for name in header.split(",") if name.startswith(("train/", "val/"))}
        assert logged <= declared, logged - declared
