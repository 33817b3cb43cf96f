"""Every checkpoint carries its contract; a resume regroups batch positions, applies optimizer
changes after the checkpoint's optimizer state is loaded, and checks the training set's size."""

from __future__ import annotations

import copy
from fractions import Fraction
from pathlib import Path

import lightning as L
import pytest
import torch

from tests.core.callbacks.tiny_regression import TinyRegression, regression_loader
from vramkit.core.callbacks.checkpoints.checkpoint_contract import (
    CONTRACT_KEY,
    CheckpointContract,
    regroup_batches,
)
from vramkit.core.callbacks.checkpoints.resume_checkpoint import ResumeCheckpoint
from vramkit.core.config.schema import ConfigError
from vramkit.core.optim.lr_schedules import WarmupDecaySchedule, warmup_decay_factor


def _contract(lr: float, per_device: int = 4, accumulate: int = 1) -> dict:
    return {
        "settings": {"model.optimizer.lr": lr, "seed": 42},
        "batch": {
            "per_device": per_device,
            "accumulate": accumulate,
            "processes": 1,
            "precision": "32-true",
        },
    }


class Scheduled(TinyRegression):
    """TinyRegression at ``lr`` with a per-step schedule that halves the rate every step."""

    def __init__(self, lr: float) -> None:
        super().__init__()
        self.lr = lr

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=self.lr, weight_decay=0.0)
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.5**step)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}


def _fit(folder: Path, model, contract: CheckpointContract, *, samples: int = 16, ckpt=None):
    trainer = L.Trainer(
        max_steps=6 if ckpt else 3,
        callbacks=[contract, ResumeCheckpoint(dirpath=str(folder), every_n_train_steps=None)],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(folder),
        limit_val_batches=0,
    )
    trainer.fit(model, regression_loader(samples, 4), ckpt_path=ckpt)
    return trainer


def test_every_checkpoint_carries_the_contract_and_its_training_samples(tmp_path):
    _fit(tmp_path, Scheduled(0.1), CheckpointContract(_contract(0.1)))
    saved = torch.load(tmp_path / "last.ckpt", weights_only=True)[CONTRACT_KEY]
    assert saved == {**_contract(0.1), "train_samples": 16}


def test_an_applied_learning_rate_scales_the_rate_and_the_schedules_base(tmp_path):
    # Lightning loads the checkpoint's optimizer state, its rate included: without the
    # contract's change the resumed run trained at 0.1 though its record said 0.02.
    _fit(tmp_path, Scheduled(0.1), CheckpointContract(_contract(0.1)))
    first = tmp_path / "first.ckpt"
    (tmp_path / "last.ckpt").rename(first)
    resumed = _fit(
        tmp_path,
        Scheduled(0.02),
        CheckpointContract(_contract(0.02), allow_changes=True),
        ckpt=str(first),
    )
    (group,) = resumed.optimizers[0].param_groups
    assert group["initial_lr"] == 0.02
    assert resumed.lr_scheduler_configs[0].scheduler.base_lrs == [0.02]
    assert group["lr"] == pytest.approx(0.02 * 0.5**6)  # the schedule went on at the new peak


class WarmedUp(TinyRegression):
    """TinyRegression stepped by vramkit's schedule with ``warmup`` steps of warm-up."""

    def __init__(self, warmup: int) -> None:
        super().__init__()
        self.lr_schedule = WarmupDecaySchedule(warmup_steps=warmup)

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
        steps = int(self.trainer.estimated_stepping_batches)
        return self.lr_schedule.lightning_config(optimizer, steps)


def test_an_applied_schedule_replaces_the_checkpoints_warm_up(tmp_path):
    def contract(warmup: int) -> dict:
        settled = _contract(0.1)
        return {**settled, "settings": {"model.lr_schedule.warmup_steps": warmup}}

    _fit(tmp_path, WarmedUp(10), CheckpointContract(contract(10)))
    first = tmp_path / "first.ckpt"
    (tmp_path / "last.ckpt").rename(first)
    allowed = CheckpointContract(contract(2), allow_changes=True)
    resumed = _fit(tmp_path, WarmedUp(2), allowed, ckpt=first)
    scheduler = resumed.lr_scheduler_configs[0].scheduler
    # The checkpoint's scheduler state said 10; the resume trains with the 2 it lists.
    assert scheduler.warmup_steps == 2
    expected = 0.1 * warmup_decay_factor(6, scheduler.total_steps, 2, "poly", 0.9)
    assert resumed.optimizers[0].param_groups[0]["lr"] == pytest.approx(expected)


def test_a_changed_setting_is_refused_unless_allowed_when_train_is_called_in_code(tmp_path):
    _fit(tmp_path, Scheduled(0.1), CheckpointContract(_contract(0.1)))
    first = tmp_path / "first.ckpt"
    (tmp_path / "last.ckpt").rename(first)
    with pytest.raises(ConfigError, match=r"differ from the checkpoint's: model\.optimizer\.lr: "):
        _fit(tmp_path, Scheduled(0.02), CheckpointContract(_contract(0.02)), ckpt=first)


def test_a_training_set_of_another_size_is_refused_unless_allowed(tmp_path):
    _fit(tmp_path, Scheduled(0.1), CheckpointContract(_contract(0.1)))
    first = tmp_path / "first.ckpt"
    (tmp_path / "last.ckpt").rename(first)
    with pytest.raises(ConfigError, match=r"the training set: 16 -> 20 samples"):
        _fit(tmp_path, Scheduled(0.1), CheckpointContract(_contract(0.1)), samples=20, ckpt=first)


LOOPS = {
    "loops": {
        "fit_loop": {
            "epoch_loop.batch_progress": {
                "total": {"ready": 7, "started": 7, "processed": 7, "completed": 7},
                "current": {"ready": 3, "started": 3, "processed": 3, "completed": 3},
            },
            "state_dict": {"combined_loader": [{"order_seed": 1, "epoch": 1, "batches_done": 3}]},
        }
    },
    "callbacks": {"Group": {"LoaderPosition": {"loaders": [{"epoch": 1, "batches_done": 3}]}}},
}


def test_positions_are_counted_in_the_new_batches():
    checkpoint = copy.deepcopy(LOOPS)
    regroup_batches(checkpoint, Fraction(4, 1))  # batch 4 -> batch 1
    progress = checkpoint["loops"]["fit_loop"]["epoch_loop.batch_progress"]
    assert progress["current"] == {"ready": 12, "started": 12, "processed": 12, "completed": 12}
    assert progress["total"]["ready"] == 16  # 4 of the earlier epoch + 12
    assert checkpoint["loops"]["fit_loop"]["state_dict"]["combined_loader"][0]["batches_done"] == 12
    loaders = checkpoint["callbacks"]["Group"]["LoaderPosition"]["loaders"]
    assert loaders[0]["batches_done"] == 12


def test_a_position_that_is_no_whole_number_of_new_batches_is_refused():
    with pytest.raises(ConfigError, match=r"after 3 batches .* no whole number"):
        regroup_batches(copy.deepcopy(LOOPS), Fraction(1, 2))  # batch 1 -> batch 2
