"""Lightning's private names that vramkit reads or sets, each behind one function.

Checked on lightning 2.6.6 (``pyproject.toml`` admits ``>=2.6.6,<2.7``); every function here has a
test in ``tests/core/compat/test_lightning_private.py``, on a real ``Trainer`` where a fit sets
what it reads.
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any

import lightning as L
from lightning.fabric.utilities.cloud_io import _is_local_file_protocol
from lightning.fabric.utilities.types import _Stateful
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.utilities.model_summary import ModelSummary

if TYPE_CHECKING:
    from lightning.pytorch.callbacks import RichProgressBar
    from lightning.pytorch.loggers import WandbLogger


def attached_trainer(module: L.LightningModule) -> L.Trainer | None:
    """The trainer ``module`` is attached to, or None: ``LightningModule._trainer``.

    The public ``module.trainer`` raises when no trainer is attached, and runs two checks per
    call on the training step's path. Checked on lightning 2.6.6
    (lightning/pytorch/core/module.py, ``LightningModule.trainer``)."""
    return module._trainer


def batches_that_stepped(trainer: L.Trainer) -> int:
    """The number of training batches that stepped the optimizers in this fit, the step that
    Lightning's logger connector logs at: ``fit_loop.epoch_loop._batches_that_stepped``.

    ``trainer.global_step`` counts optimizer steps instead (several per batch with several
    optimizers). Checked on lightning 2.6.6 (lightning/pytorch/loops/training_epoch_loop.py)."""
    return trainer.fit_loop.epoch_loop._batches_that_stepped


def dump_checkpoint(trainer: L.Trainer, *, weights_only: bool) -> dict[str, Any]:
    """The checkpoint ``trainer.save_checkpoint`` would write, as a dict, without its barrier:
    ``Trainer._checkpoint_connector.dump_checkpoint``.

    Checked on lightning 2.6.6
    (lightning/pytorch/trainer/connectors/checkpoint_connector.py)."""
    return trainer._checkpoint_connector.dump_checkpoint(weights_only=weights_only)


def checkpoint_every_n_train_steps(callback: ModelCheckpoint) -> int:
    """``ModelCheckpoint``'s ``every_n_train_steps`` as it acts (0: never on a step count):
    ``ModelCheckpoint._every_n_train_steps``. Checked on lightning 2.6.6
    (lightning/pytorch/callbacks/model_checkpoint.py, ``on_train_batch_end``)."""
    return callback._every_n_train_steps


def checkpoint_train_time_interval(callback: ModelCheckpoint) -> timedelta | None:
    """``ModelCheckpoint``'s ``train_time_interval`` (None: never on elapsed time):
    ``ModelCheckpoint._train_time_interval``. Checked on lightning 2.6.6
    (lightning/pytorch/callbacks/model_checkpoint.py, ``on_train_batch_end``)."""
    return callback._train_time_interval


def set_summary_flop_counter(summary: ModelSummary, counter: Any) -> None:
    """Make ``summary`` read its FLOPs (``total_flops`` and the table's FLOPs column) from
    ``counter``, an object with ``get_total_flops()`` and ``get_flop_counts()`` like
    ``torch.utils.flop_counter.FlopCounterMode``: sets ``ModelSummary._flop_counter``.

    Checked on lightning 2.6.6 (lightning/pytorch/utilities/model_summary/model_summary.py)."""
    summary._flop_counter = counter


def summary_rows(summary: ModelSummary) -> list[tuple[str, list[str]]]:
    """The columns of ``summary``'s table as ``(header, cells)``, what
    ``ModelSummary.summarize`` takes: ``ModelSummary._get_summary_data()``.

    Checked on lightning 2.6.6 (lightning/pytorch/utilities/model_summary/model_summary.py)."""
    return summary._get_summary_data()


def is_stateful(obj: Any) -> bool:
    """Whether Lightning saves ``obj``'s state in a checkpoint (it has ``state_dict`` and
    ``load_state_dict``): ``isinstance(obj, lightning.fabric.utilities.types._Stateful)``, the
    test Lightning's fit loop applies to training loaders. Checked on lightning 2.6.6."""
    return isinstance(obj, _Stateful)


def is_local_path(path: str | Any) -> bool:
    """Whether ``path`` (a string or ``os.PathLike``) names a local file rather than a remote
    fsspec URL (``s3://``...), decided as Lightning's checkpoint IO decides it:
    ``lightning.fabric.utilities.cloud_io._is_local_file_protocol``. Checked on lightning 2.6.6."""
    return _is_local_file_protocol(path)


def rich_console_kwargs(bar: RichProgressBar) -> dict[str, Any]:
    """The ``console_kwargs`` a ``RichProgressBar`` was made with (``{}`` when none), from which
    it configures its console: ``RichProgressBar._console_kwargs``. Checked on lightning 2.6.6
    (lightning/pytorch/callbacks/progress/rich_progress.py)."""
    return bar._console_kwargs


def wandb_init_kwargs(logger: WandbLogger) -> dict[str, Any]:
    """The keyword arguments ``WandbLogger`` will give ``wandb.init``, as the dict it keeps
    (changes to it reach ``wandb.init``): ``WandbLogger._wandb_init``. Checked on lightning
    2.6.6 (lightning/pytorch/loggers/wandb.py)."""
    return logger._wandb_init


def wandb_offline(logger: WandbLogger) -> bool:
    """Whether ``WandbLogger`` was made with ``offline=True``: ``WandbLogger._offline``.
    Checked on lightning 2.6.6 (lightning/pytorch/loggers/wandb.py)."""
    return logger._offline
