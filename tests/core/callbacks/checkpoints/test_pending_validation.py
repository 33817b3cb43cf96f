"""No validation is lost to a stop: a fit stopped between a training batch and the validation pass
that follows it, or during that pass, resumes into the pass and ends with the uninterrupted fit's
validation metrics, best checkpoint and weights."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from tests.core.callbacks.resumable_fit import STEPS_PER_EPOCH, fit, same, weights
from vramkit.core.callbacks.stop_signals import RunStopped


class Validations(L.Callback):
    """Records (epoch, step, val/loss) at the end of every validation pass of a fit."""

    def __init__(self) -> None:
        self.seen: list[tuple[int, int, float]] = []

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.sanity_checking:
            loss = float(trainer.callback_metrics["val/loss"])
            self.seen.append((trainer.current_epoch, trainer.global_step, loss))


class TermAt(L.Callback):
    """SIGTERM to this process at the first ``hook`` (``train_batch_end``,
    ``validation_batch_end`` or ``validation_end``) once training reached step ``step``."""

    def __init__(self, step: int, hook: str) -> None:
        self.step, self.hook = step, hook
        self.sent = False

    def _send(self, trainer: L.Trainer, hook: str) -> None:
        if hook == self.hook and not self.sent and trainer.global_step >= self.step:
            self.sent = True
            os.kill(os.getpid(), signal.SIGTERM)

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        self._send(trainer, "train_batch_end")

    def on_validation_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        self._send(trainer, "validation_batch_end")

    def on_validation_end(self, trainer: L.Trainer, *args: Any) -> None:
        self._send(trainer, "validation_end")


def _fit(folder: Path, *callbacks: L.Callback, **trainer_args: Any) -> dict[str, Any]:
    """A 2-epoch fit ranking every epoch's val/loss, resumed if ``folder`` has last.ckpt; what it
    ended with."""
    validations = Validations()
    ranked = ModelCheckpoint(
        dirpath=folder / "ranked", monitor="val/loss", filename="{epoch}", save_top_k=-1
    )
    last = folder / "last.ckpt"
    _, model = fit(
        folder,
        ckpt_path=last if last.exists() else None,
        every_n_train_steps=None,
        callbacks=[validations, ranked, *callbacks],
        **trainer_args,
    )
    return {
        "validations": validations.seen,
        "best": (ranked.best_model_score, Path(ranked.best_model_path).name),
        "ranked": {Path(path).name: float(score) for path, score in ranked.best_k_models.items()},
        "weights": weights(model),
    }


# (training step the stop comes after, the hook the signal comes in, Trainer settings)
STOPS = {
    "epoch_end": (STEPS_PER_EPOCH, "train_batch_end", {}),
    "epoch_end_in_validation": (STEPS_PER_EPOCH, "validation_batch_end", {}),
    "mid_epoch_validation": (3, "train_batch_end", {"val_check_interval": 3}),
    # No pass follows this batch: the resumed fit must not add one.
    "epoch_without_validation": (
        STEPS_PER_EPOCH,
        "train_batch_end",
        {"check_val_every_n_epoch": 2},
    ),
    # After the pass: the run stops at the epoch's end, once the best checkpoint is ranked.
    "after_validation": (STEPS_PER_EPOCH, "validation_end", {}),
}


@pytest.mark.parametrize("stop", STOPS.values(), ids=STOPS.keys())
def test_a_stop_before_or_in_a_validation_resumes_into_it(stop, tmp_path):
    step, hook, trainer_args = stop
    straight = _fit(tmp_path / "straight", **trainer_args)
    stopped_validations = Validations()
    with pytest.raises(RunStopped):
        _fit(tmp_path / "run", stopped_validations, TermAt(step, hook), **trainer_args)
    saved = torch.load(tmp_path / "run" / "last.ckpt", weights_only=True)
    assert saved["global_step"] == step
    if hook == "validation_batch_end":  # stopped at the pass's first batch boundary, not its end
        passed = saved["loops"]["fit_loop"]["epoch_loop.val_loop.batch_progress"]["current"]
        assert passed["processed"] == 0
    resumed = _fit(tmp_path / "run", **trainer_args)
    assert stopped_validations.seen + resumed["validations"] == straight["validations"]
    assert resumed["ranked"] == straight["ranked"]
    assert resumed["best"] == straight["best"]
    assert same(resumed["weights"], straight["weights"])


def test_any_checkpoint_of_an_epochs_last_step_resumes_into_its_validation(tmp_path):
    straight = _fit(tmp_path / "straight")
    # A ModelCheckpoint of every step, with no stop: what a run killed during validation leaves.
    every_step = ModelCheckpoint(
        dirpath=tmp_path / "steps", filename="{step}", every_n_train_steps=1, save_top_k=-1
    )
    _fit(tmp_path / "first", every_step)
    validations = Validations()
    _, resumed = fit(
        tmp_path / "resumed",
        ckpt_path=tmp_path / "steps" / f"step={STEPS_PER_EPOCH}.ckpt",
        callbacks=[validations],
    )
    assert validations.seen == straight["validations"]
    assert same(weights(resumed), straight["weights"])
