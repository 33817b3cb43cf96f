"""Every default callback takes a module whose batches are lists; a run registers only the
callbacks that have work in it, and Lightning calls only the per-batch hooks they implement."""

from __future__ import annotations

from typing import Any

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger
from omegaconf import OmegaConf
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from vramkit.core.callbacks.bad_input_report import BadInputReport
from vramkit.core.callbacks.max_time_annealing import MaxTimeAnnealing
from vramkit.core.callbacks.memory.oom_fault_injection import OOMFaultInjection
from vramkit.core.callbacks.throughput_monitor import ThroughputMonitor
from vramkit.core.config.instantiate import instantiate_group
from vramkit.core.io.checkpoint_io import AtomicCheckpointIO
from vramkit.core.oom.resilient_module import OOMResilientModule
from vramkit.core.run.settling.compose import CONF_DIR
from vramkit.core.trainer_assembly.working_set import (
    callbacks_of_type,
    keep_working_callbacks,
    skip_idle_batch_hooks,
)

BATCH = 8


class _ListBatches(OOMResilientModule):
    """Batches are ``[inputs, targets]`` lists, as a TensorDataset gives them."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(4, 1)

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.mse_loss(self.net(x).squeeze(-1), y)
        self.log("train/loss", loss, prog_bar=True, batch_size=len(y))
        return loss

    def validation_step(self, batch: list[torch.Tensor], batch_idx: int) -> None:
        x, y = batch
        self.log("val/loss", F.mse_loss(self.net(x).squeeze(-1), y), batch_size=len(y))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


class _ListData(L.LightningDataModule):
    """List batches, and the input-problem report the project's datamodules give."""

    def train_dataloader(self) -> DataLoader:
        return _loader()

    def val_dataloader(self) -> DataLoader:
        return _loader()

    def data_problems(self) -> dict[str, int]:
        return {}


def _loader() -> DataLoader:
    generator = torch.Generator().manual_seed(0)
    data = TensorDataset(
        torch.randn(16, 4, generator=generator), torch.randn(16, generator=generator)
    )
    return DataLoader(data, batch_size=BATCH)


def _trainer(tmp_path, callbacks: list[L.Callback], **settings: Any) -> L.Trainer:
    return L.Trainer(
        accelerator="cpu",
        max_epochs=2,
        log_every_n_steps=1,
        logger=CSVLogger(tmp_path, name="csv"),
        default_root_dir=tmp_path,
        plugins=[AtomicCheckpointIO()],
        callbacks=callbacks,
        **settings,
    )


@pytest.mark.slow
def test_every_default_callback_runs_a_module_with_list_batches(compose_config, tmp_path):
    # a fault, a time limit and offloading give the optional callbacks work too
    cfg = compose_config(
        "+hw=cpu",
        "+fault.oom_train_above=4",
        "optimized_metric=val/loss",
        "callbacks.activation_offload.enabled=true",
    )
    callbacks = instantiate_group(cfg.callbacks)
    defaults = OmegaConf.load(CONF_DIR / "callbacks" / "default.yaml").defaults
    assert len(callbacks) == len(cfg.callbacks) == len([d for d in defaults if d != "_self_"])
    trainer = _trainer(tmp_path, callbacks, max_time={"minutes": 10})
    data = _ListData()
    assert keep_working_callbacks(trainer, data) == []
    module = _ListBatches()
    trainer.fit(module, datamodule=data)
    assert trainer.global_step == 4
    assert module.oom_state.train_micro_batch == 4  # the list batch was split in two
    (throughput,) = callbacks_of_type(trainer, ThroughputMonitor)
    assert throughput.summary["perf/train_samples_per_s"] > 0
    assert trainer.callback_metrics["data/skipped_train_images"] == 0
    assert trainer.callback_metrics["mem/val_peak_gib"] > 0


def test_callbacks_with_nothing_to_do_are_not_registered(tmp_path):
    fault, annealing, report = OOMFaultInjection(), MaxTimeAnnealing(), BadInputReport()
    trainer = _trainer(tmp_path, [fault, annealing, report])
    dropped = keep_working_callbacks(trainer)  # loaders given directly: no input report
    assert dropped == ["OOMFaultInjection", "MaxTimeAnnealing", "BadInputReport"]
    assert not {id(fault), id(annealing), id(report)} & {id(c) for c in trainer.callbacks}
    with_work = [MaxTimeAnnealing(), OOMFaultInjection(oom_val_above=2), BadInputReport()]
    timed = _trainer(tmp_path, with_work, max_time="00:00:10:00")
    assert keep_working_callbacks(timed, _ListData()) == []


class _CountsBatchEnds(L.Callback):
    def __init__(self) -> None:
        self.batch_ends = 0

    def on_train_batch_end(self, *_: Any) -> None:
        self.batch_ends += 1


def test_lightning_calls_only_the_per_batch_hooks_a_callback_implements(tmp_path, monkeypatch):
    counting = _CountsBatchEnds()
    skipped = skip_idle_batch_hooks(counting)
    assert "on_train_batch_end" not in skipped and "on_before_backward" in skipped
    called: list[L.Callback] = []
    original = L.Callback.on_before_backward

    def spy(self: L.Callback, *args: Any) -> None:
        called.append(self)
        original(self, *args)

    monkeypatch.setattr(L.Callback, "on_before_backward", spy)
    plain = _CountsBatchEnds()
    trainer = _trainer(
        tmp_path,
        [counting, plain],
        enable_progress_bar=False,
        enable_checkpointing=False,
        enable_model_summary=False,
    )
    trainer.fit(_ListBatches(), train_dataloaders=_loader(), val_dataloaders=_loader())
    assert counting.batch_ends == plain.batch_ends == 4
    # Lightning still calls the inherited empty hook of the untouched callback, not the other's
    assert called == [plain] * 4


def test_a_checkpoint_saved_per_epoch_is_not_called_per_batch_but_one_per_steps_is(tmp_path):
    per_epoch = ModelCheckpoint(dirpath=tmp_path / "epoch", save_top_k=-1)
    per_step = ModelCheckpoint(dirpath=tmp_path / "step", every_n_train_steps=2, save_top_k=-1)
    assert "on_train_batch_end" in skip_idle_batch_hooks(per_epoch)
    assert "on_train_batch_end" not in skip_idle_batch_hooks(per_step)
    trainer = _trainer(tmp_path, [per_epoch, per_step], enable_progress_bar=False)
    trainer.fit(_ListBatches(), train_dataloaders=_loader())
    assert len(list((tmp_path / "epoch").glob("*.ckpt"))) == 2  # one per epoch, as before
    assert len(list((tmp_path / "step").glob("*.ckpt"))) == 2  # steps 2 and 4
