"""The SAGE chain end to end at toy size: teacher → feature cache → student.

A tiny teacher is trained and its features cached once per module; the tests then run
``fast_dev_run`` of both tasks through ``train()``, check that the projector learns and is
checkpointed, that the teacher is never given the answer, that the student reads tokens (not
features), and that a missing or mismatched teacher or cache is refused with the command that
makes the right one.
"""

from __future__ import annotations

import csv
import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import lightning as L
import pytest
import torch
from omegaconf import DictConfig
from tiny_runs import TINY_ARC_ON_CPU
from torch import nn

from vramkit.core.config.instantiate import instantiate
from vramkit.core.run.settling.compose import compose_config, forget_composition, settled_config
from vramkit.core.run.settling.settle import settle
from vramkit.core.run.train import train
from vramkit.tasks.sage.data.arc_examples import INPUT_KEYS
from vramkit.tasks.sage.distill_module import REPORT_NAME
from vramkit.tasks.sage.grid_module import SCORES_KEY, ArcTeacherModule
from vramkit.tasks.sage.teacher_features.feature_cache import FeatureCacheError
from vramkit.tasks.sage.teacher_features.feature_extraction import (
    extract_teacher_features,
    run_extraction,
)
from vramkit.tasks.sage.teacher_features.teacher_checkpoint import TEACHER_NETWORK_KEY

TINY = TINY_ARC_ON_CPU
STUDENT = ("task=sage_distill", *TINY, "teacher.views=2", "model.report.repeats=1")


def _compose(run_dir: Path, data_dir: Path, log_dir: Path, *overrides: str) -> DictConfig:
    """Compose like ``python train.py <overrides>``, with this module's folders (as overrides:
    a run composes its config again from them)."""
    paths = (f"paths.log_dir={log_dir}", f"paths.data_dir={data_dir}")
    return compose_config("train", (*overrides, *paths), output_dir=run_dir)


@dataclass(frozen=True)
class Chain:
    teacher_checkpoint: Path
    teacher_run: Path
    cache_dir: Path
    root: Path


@pytest.fixture(scope="module")
def chain(tmp_path_factory: pytest.TempPathFactory, shared_data_dir: Path):
    root = tmp_path_factory.mktemp("sage_chain")
    logs = root / "logs"
    teacher_run = root / "teacher_run"
    try:
        teacher_cfg = _compose(
            teacher_run,
            shared_data_dir,
            logs,
            "task=arc_teacher",
            *TINY,
            "logger=csv",
            "trainer.max_epochs=1",
            "+trainer.limit_train_batches=2",
            "+trainer.limit_val_batches=2",
        )
        train(teacher_cfg)
        checkpoint = teacher_run / "checkpoints" / "last.ckpt"
        extract_cfg = _compose(
            root / "extract", shared_data_dir, logs, *STUDENT, f"teacher.checkpoint={checkpoint}"
        )
        cache_dir = run_extraction(extract_cfg)
    finally:
        forget_composition()
    return Chain(checkpoint, teacher_run, cache_dir, root)


def _metric_names(run_dir: Path) -> set[str]:
    (metrics_csv,) = run_dir.glob("csv/version_*/metrics.csv")
    with metrics_csv.open() as handle:
        return set(next(csv.reader(handle)))


def test_teacher_run_scores_and_describes_its_network(chain):
    names = _metric_names(chain.teacher_run)
    assert {"val/cell_acc", "val/changed_cell_acc", "val/exact_match", "val/copy_cell_acc"} <= names
    phase_metrics = {name for name in names if name.startswith(("train/", "val/", "test/"))}
    assert phase_metrics <= ArcTeacherModule.logged_metrics(), "monitors are checked against it"
    state = torch.load(chain.teacher_checkpoint, weights_only=True)
    assert state[TEACHER_NETWORK_KEY]["_target_"].endswith("GridTransformer")
    assert state[TEACHER_NETWORK_KEY]["d_model"] == 16
    # the checkpoint carries its weights' validation scores (the report reads them from the file)
    assert set(state[SCORES_KEY]) == {"", "copy_"}
    assert state[SCORES_KEY]["copy_"]["changed_cell_acc"] == 0.0


def test_fast_dev_run_arc_teacher(compose_config):
    cfg = compose_config("task=arc_teacher", *TINY, "debug=fdr")
    train(cfg)
    assert (Path(cfg.paths.output_dir) / "resolved_config.yaml").is_file()


@pytest.mark.slow
def test_fast_dev_run_sage_distill_writes_the_compression_report(compose_config, chain):
    cfg = compose_config(*STUDENT, "debug=fdr", f"teacher.checkpoint={chain.teacher_checkpoint}")
    train(cfg)
    report = json.loads((Path(cfg.paths.output_dir) / REPORT_NAME).read_text())
    assert set(report["models"]) == {"teacher", "student", "copy_input"}
    for name in ("teacher", "student"):
        assert set(report["models"][name]["scores"]) >= {"cell_acc", "changed_cell_acc"}
        assert all(v > 0 for v in report["models"][name]["latency_ms"].values())
    teacher_params = report["models"]["teacher"]["parameters"]
    student_params = report["models"]["student"]["parameters"]
    assert report["parameter_ratio"] == pytest.approx(teacher_params / student_params)
    assert set(report["latency_ratio"]) == {"1", "32"}
    assert report["projector_parameters"] == 16 * 16 + 16
    assert report["student_checkpoint"]["path"] is None  # fast_dev_run ranks no checkpoint


class ProjectorSnapshot(L.Callback):
    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.initial = pl_module.projector.weight.detach().clone()


def _student(compose_config, chain, *overrides: str):
    cfg = compose_config(*STUDENT, f"teacher.checkpoint={chain.teacher_checkpoint}", *overrides)
    cfg = settled_config(settle(cfg, plan_batches=False))  # no cache to plan from
    return cfg, instantiate(cfg.data), instantiate(cfg.model)


@pytest.mark.slow
def test_the_projector_is_optimised_and_checkpointed(compose_config, chain, tmp_path):
    _, datamodule, model = _student(compose_config, chain, "model.report.batch_sizes=[1,2]")
    snapshot = ProjectorSnapshot()
    trainer = L.Trainer(
        max_steps=3,
        limit_val_batches=0,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
        callbacks=[snapshot, L.pytorch.callbacks.ModelCheckpoint(tmp_path, save_last=True)],
    )
    trainer.fit(model, datamodule=datamodule)
    state = torch.load(tmp_path / "last.ckpt", weights_only=True)
    saved = state["state_dict"]["projector.weight"]
    assert saved.shape == (16, 16)  # student width → teacher width (read from the cache)
    assert not torch.equal(saved, snapshot.initial)
    assert state["hyper_parameters"]["teacher_width"] == datamodule.teacher_width


def test_the_student_reads_tokens_not_teacher_features(compose_config, chain):
    _, datamodule, model = _student(compose_config, chain)
    datamodule.setup("fit")
    batch = next(iter(datamodule.val_dataloader()))
    assert "teacher_features" in batch
    model.eval()
    with torch.no_grad():
        before = model(batch).cell_logits
        scrambled = {
            **batch,
            "teacher_features": torch.randn_like(batch["teacher_features"].float()),
        }
        after = model(scrambled).cell_logits
    assert torch.equal(before, after)


class SpyTeacher(nn.Module):
    """Records what it is given; its features are a fixed function of the input tokens."""

    feature_width = 4

    def __init__(self) -> None:
        super().__init__()
        self.seen_keys: set[str] = set()

    def encode_inputs(self, batch):
        self.seen_keys |= set(batch)
        return batch["tokens"].float()[..., None].expand(-1, -1, 4) + torch.arange(4.0)


def test_the_teacher_is_given_inputs_only(compose_config, chain, tmp_path):
    _, datamodule, _ = _student(compose_config, chain, f"data.feature_cache={tmp_path}/cache")
    spy = SpyTeacher()
    info = {"checkpoint": "spy", "sha256": "0" * 64, "parameters": 0, "network": {}}
    manifest = extract_teacher_features(datamodule, spy, info, device=torch.device("cpu"))
    assert spy.seen_keys == set(INPUT_KEYS)
    assert manifest["splits"]["val"]["teacher_predictions"] is False
    # the student's items line up with the spy's features: feature 0 is the token id
    datamodule.resolve_teacher = lambda: (Path("spy"), "0" * 64)
    datamodule.setup("fit")
    item = datamodule.train_dataset[0]
    assert torch.equal(item["teacher_features"][:, 0].long(), item["tokens"])


def test_a_cache_of_another_teacher_is_refused(compose_config, chain, tmp_path):
    other = tmp_path / "other_teacher.ckpt"
    shutil.copy(chain.teacher_checkpoint, other)
    with other.open("ab") as handle:
        handle.write(b"another teacher")
    _, datamodule, _ = _student(
        compose_config,
        chain,
        f"teacher.checkpoint={other}",
        f"data.feature_cache={chain.cache_dir}",
    )
    with pytest.raises(FeatureCacheError, match=r"another teacher.*extract_teacher_features\.py"):
        datamodule.setup("fit")
    # with the default per-teacher folder, there is simply no cache for it yet
    _, datamodule, _ = _student(compose_config, chain, f"teacher.checkpoint={other}")
    with pytest.raises(
        FileNotFoundError, match=r"python scripts/extract_teacher_features\.py task=sage_distill"
    ):
        datamodule.setup("fit")


def test_a_missing_teacher_names_the_command(compose_config):
    cfg = compose_config(*STUDENT, "teacher.checkpoint=latest")
    cfg = settled_config(settle(cfg, plan_batches=False))  # no cache to plan from
    datamodule = instantiate(cfg.data)
    with pytest.raises(FileNotFoundError, match=r"python train\.py task=arc_teacher"):
        datamodule.setup("fit")


def test_extraction_refuses_the_teacher_task(compose_config):
    cfg = compose_config("task=arc_teacher", *TINY)
    with pytest.raises(ValueError, match="run with task=sage_distill"):
        run_extraction(cfg)
