"""Each accessor of vramkit/core/compat/lightning_private.py on the installed Lightning: these
fail when a Lightning release renames, retypes or stops updating what an accessor reads."""

from __future__ import annotations

from datetime import timedelta

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint, RichProgressBar
from lightning.pytorch.loggers import WandbLogger
from lightning.pytorch.utilities.model_summary import summarize
from torch.utils.data import DataLoader

from tests.core.callbacks.tiny_regression import TinyRegression, regression_loader
from vramkit.core.compat import lightning_private
from vramkit.core.data.resumable_loader import ResumableDataLoader

STEPS = 3


@pytest.fixture(scope="module")
def fitted(tmp_path_factory: pytest.TempPathFactory) -> tuple[L.Trainer, TinyRegression]:
    """A trainer after a fit of ``STEPS`` batches of the tiny regression."""
    module = TinyRegression()
    trainer = L.Trainer(
        accelerator="cpu",
        max_steps=STEPS,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
        default_root_dir=tmp_path_factory.mktemp("fit"),
    )
    trainer.fit(module, regression_loader(16, 4))
    return trainer, module


@pytest.mark.slow
def test_attached_trainer_is_the_fits_trainer_and_none_before(fitted):
    trainer, module = fitted
    assert lightning_private.attached_trainer(module) is trainer
    assert lightning_private.attached_trainer(TinyRegression()) is None


@pytest.mark.slow
def test_batches_that_stepped_counts_the_fits_batches(fitted):
    trainer, _ = fitted
    assert lightning_private.batches_that_stepped(trainer) == STEPS


@pytest.mark.slow
def test_dump_checkpoint_holds_weights_and_optimizer_state_on_request(fitted):
    trainer, module = fitted
    full = lightning_private.dump_checkpoint(trainer, weights_only=False)
    assert torch.equal(full["state_dict"]["net.weight"], module.net.weight)
    assert full["global_step"] == STEPS and len(full["optimizer_states"]) == 1
    assert "optimizer_states" not in lightning_private.dump_checkpoint(trainer, weights_only=True)


def test_checkpoint_schedule_reads_as_constructed():
    assert lightning_private.checkpoint_every_n_train_steps(ModelCheckpoint()) == 0
    steps = ModelCheckpoint(every_n_train_steps=7)
    assert lightning_private.checkpoint_every_n_train_steps(steps) == 7
    assert lightning_private.checkpoint_train_time_interval(steps) is None
    timed = ModelCheckpoint(train_time_interval=timedelta(minutes=5))
    assert lightning_private.checkpoint_train_time_interval(timed) == timedelta(minutes=5)


class _Counts:
    """What the summary asks of a FLOP counter."""

    def get_total_flops(self) -> int:
        return 1234

    def get_flop_counts(self) -> dict[str, dict[str, int]]:
        return {"TinyRegression.net": {"mm": 1000}}


def test_the_summary_table_reads_flops_from_the_counter_it_is_given():
    summary = summarize(TinyRegression(), max_depth=1)
    lightning_private.set_summary_flop_counter(summary, _Counts())
    assert summary.total_flops == 1234
    columns = dict(lightning_private.summary_rows(summary))
    assert columns["Name"] == ["net"]
    assert columns["FLOPs"] == ["1.0 K"]


def test_is_stateful_as_lightnings_loop_decides():
    data = regression_loader(4, 2).dataset
    assert lightning_private.is_stateful(ResumableDataLoader(data, batch_size=2))
    assert not lightning_private.is_stateful(DataLoader(data, batch_size=2))


def test_is_local_path_tells_files_from_remote_urls(tmp_path):
    assert lightning_private.is_local_path(tmp_path / "last.ckpt")
    assert lightning_private.is_local_path(str(tmp_path / "last.ckpt"))
    assert lightning_private.is_local_path(f"file://{tmp_path}/last.ckpt")
    assert not lightning_private.is_local_path("s3://bucket/last.ckpt")
    assert not lightning_private.is_local_path("memory://last.ckpt")


def test_rich_console_kwargs_are_those_the_bar_was_made_with():
    assert lightning_private.rich_console_kwargs(RichProgressBar()) == {}
    made = RichProgressBar(console_kwargs={"force_terminal": True})
    assert lightning_private.rich_console_kwargs(made) == {"force_terminal": True}


def test_wandb_init_kwargs_are_the_dict_wandb_init_gets(tmp_path):
    logger = WandbLogger(offline=True, save_dir=str(tmp_path), project="p")
    assert lightning_private.wandb_offline(logger)
    assert not lightning_private.wandb_offline(WandbLogger(save_dir=str(tmp_path)))
    init = lightning_private.wandb_init_kwargs(logger)
    assert init["project"] == "p"
    init["tags"] = ["x"]
    assert lightning_private.wandb_init_kwargs(logger)["tags"] == ["x"]  # the same dict
