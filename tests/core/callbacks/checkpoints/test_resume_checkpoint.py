"""last.ckpt: written every n steps, at epoch ends and at stops; a fit resumed from any of them ends
bitwise where the uninterrupted fit ends; stop signals save, then end the run non-zero."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from types import SimpleNamespace

import lightning as L
import pytest
import torch
from lightning.fabric.plugins.environments import SLURMEnvironment
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.trainer.states import TrainerFn

from tests.core.callbacks.resumable_fit import STEPS_PER_EPOCH, fit, same, weights
from vramkit.core.callbacks.checkpoints.resume_checkpoint import ResumeCheckpoint
from vramkit.core.callbacks.stop_signals import RunStopped


class SignalSelf(L.Callback):
    """Sends ``signum`` to this process at the end of training step ``step`` (a signal during
    validation is test_pending_validation.py's)."""

    def __init__(self, signum: int, step: int) -> None:
        self.signum, self.step = signum, step
        self.sent = False

    def on_train_batch_end(self, trainer, *args) -> None:
        if not self.sent and trainer.global_step >= self.step:
            self.sent = True
            os.kill(os.getpid(), self.signum)


class StopAt(L.Callback):
    """Sets ``trainer.should_stop`` at training step ``step``, as max_time's Timer does."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer, *args) -> None:
        if trainer.global_step == self.step:
            trainer.should_stop = True


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory):
    """Final weights of a 2-epoch fit, and a checkpoint of every one of its steps."""
    folder = tmp_path_factory.mktemp("uninterrupted")
    every_step = ModelCheckpoint(
        dirpath=folder / "steps", filename="{step}", every_n_train_steps=1, save_top_k=-1
    )
    _, model = fit(folder, callbacks=[every_step])
    return weights(model), folder / "steps"


@pytest.mark.parametrize("step", [1, STEPS_PER_EPOCH - 1, STEPS_PER_EPOCH + 2])
def test_a_fit_resumed_mid_epoch_ends_with_the_same_weights(step, uninterrupted, tmp_path):
    final, steps = uninterrupted
    _, resumed = fit(tmp_path, ckpt_path=steps / f"step={step}.ckpt")
    assert same(weights(resumed), final)


def test_without_the_random_state_dropout_makes_the_resumed_fit_differ(uninterrupted, tmp_path):
    final, steps = uninterrupted
    _, resumed = fit(tmp_path, ckpt_path=steps / "step=3.ckpt", restore_random_state=False)
    assert not same(weights(resumed), final)


def test_last_ckpt_follows_the_steps_and_the_epoch_ends(tmp_path):
    written = []

    class Spy(L.Callback):
        def on_save_checkpoint(self, trainer, pl_module, checkpoint) -> None:
            written.append(checkpoint["global_step"])

    fit(tmp_path, epochs=1, every_n_train_steps=2, callbacks=[Spy()])
    # steps 2, 4, 6 and the end of the epoch (step 6 again, after validation)
    assert written == [2, 4, 6, 6]
    assert torch.load(tmp_path / "last.ckpt", weights_only=True)["global_step"] == 6


def test_step_writes_under_accumulation_come_only_where_a_step_ends(tmp_path):
    # Accumulated gradients are no part of a checkpoint: one written after the first of two
    # accumulated batches (global_step unchanged, so "every 1 step" held) resumed that step short.
    written = []

    class Spy(L.Callback):
        def on_save_checkpoint(self, trainer, pl_module, checkpoint) -> None:
            progress = checkpoint["loops"]["fit_loop"]["epoch_loop.batch_progress"]
            written.append((checkpoint["global_step"], progress["current"]["completed"]))

    fit(tmp_path, epochs=1, every_n_train_steps=1, callbacks=[Spy()], accumulate_grad_batches=2)
    # 6 batches, 3 steps: written after batches 2, 4, 6 (as 1, 3, 5 completed: Lightning
    # counts the batch after the hook), and at the epoch's end
    assert [step for step, _ in written] == [1, 2, 3, 3]
    assert [batches % 2 for _, batches in written[:-1]] == [1, 1, 1]


def test_an_early_stop_keeps_its_step_so_the_resumed_run_finishes_the_cut_epoch(
    uninterrupted, tmp_path
):
    final, _ = uninterrupted
    stop_step = STEPS_PER_EPOCH + 2
    trainer, _ = fit(tmp_path, every_n_train_steps=None, callbacks=[StopAt(stop_step)])
    assert trainer.global_step == stop_step
    saved = torch.load(tmp_path / "last.ckpt", weights_only=True)
    assert saved["global_step"] == stop_step, "the epoch-end write must not replace the stop state"
    resumed_trainer, resumed = fit(tmp_path / "resumed", ckpt_path=tmp_path / "last.ckpt")
    assert resumed_trainer.global_step == 2 * STEPS_PER_EPOCH
    assert same(weights(resumed), final)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGUSR1])
def test_a_stop_signal_saves_at_the_next_step_and_exits_non_zero(signum, uninterrupted, tmp_path):
    final, _ = uninterrupted
    before = signal.getsignal(signum)
    with pytest.raises(RunStopped) as stopped:
        fit(tmp_path, every_n_train_steps=None, callbacks=[SignalSelf(signum, step=2)])
    assert stopped.value.code == 128 + signum and stopped.value.signal == signum
    assert signal.getsignal(signum) == before, "the previous handler must come back"
    saved = torch.load(tmp_path / "last.ckpt", weights_only=True)
    assert saved["global_step"] == 2 and saved["epoch"] == 0  # before the first epoch ended
    _, resumed = fit(tmp_path / "resumed", ckpt_path=tmp_path / "last.ckpt")
    assert same(weights(resumed), final)


def test_a_slurm_requeue_handler_keeps_sigusr1(tmp_path, monkeypatch):
    """With SLURM auto-requeue, SIGUSR1 stays Lightning's: it writes its hpc checkpoint and
    requeues (scontrol is absent here, which it reports), and training goes on."""
    for key, value in {
        "SLURM_NTASKS": "1",
        "SLURM_JOB_NAME": "drill",
        "SLURM_JOB_ID": "4242",
        "SLURM_NODELIST": "localhost",
        "SLURM_LOCALID": "0",
        "SLURM_PROCID": "0",
        "SLURM_NODEID": "0",
    }.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("PATH", str(tmp_path))  # no scontrol: the requeue call fails harmlessly
    trainer, _ = fit(
        tmp_path,
        epochs=1,
        every_n_train_steps=None,
        callbacks=[SignalSelf(signal.SIGUSR1, step=2)],
        plugins=[SLURMEnvironment(auto_requeue=True)],
    )
    assert trainer.global_step == STEPS_PER_EPOCH, "SIGUSR1 under SLURM requeue must not stop"
    assert (tmp_path / "hpc_ckpt_1.ckpt").is_file()


@pytest.mark.parametrize(
    ("arguments", "key"),
    [
        ({"every_n_train_steps": 0}, "every_n_train_steps"),
        ({"min_interval_s": -1}, "min_interval_s"),
        ({"stop_signals": ["SIGTREM"]}, "stop_signals"),
    ],
)
def test_bad_settings_name_their_key(arguments: dict, key: str, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=f"last_checkpoint.{key}"):
        ResumeCheckpoint(dirpath=str(tmp_path), **arguments)


class _Launcher:
    """A stand-in for hydra-submitit-launcher's launcher: resubmits itself with its arguments,
    as its ``checkpoint`` does (``submitit.helpers.DelayedSubmission(self, *args)``)."""

    def __call__(self, overrides: list[str]) -> None:
        raise AssertionError("the requeued job is not run in this test")

    def checkpoint(self, *args: object) -> object:
        import submitit

        return submitit.helpers.DelayedSubmission(self, *args)


def test_submitits_signal_saves_at_the_next_step_then_submitit_requeues(
    uninterrupted, tmp_path, monkeypatch
):
    """submitit's own signal handler (a local job's environment) runs only once last.ckpt holds
    the next step: it resubmits the job and ends the process with the requeue status 144."""
    from submitit.core.job_environment import JobEnvironment
    from submitit.core.utils import DelayedSubmission, JobPaths
    from submitit.local.local import LOCAL_REQUEUE_RETURN_CODE

    final, _ = uninterrupted
    for key, value in {
        "SUBMITIT_EXECUTOR": "local",
        "SUBMITIT_FOLDER": str(tmp_path / "submitit"),
        "SUBMITIT_LOCAL_JOB_ID": "77",
    }.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("SUBMITIT_PREEMPT_SIGNAL", raising=False)
    paths = JobPaths(tmp_path / "submitit", job_id="77", task_id=0)
    paths.folder.mkdir(parents=True)
    delayed = DelayedSubmission(_Launcher(), ["seed=1"])
    delayed.set_timeout(60, 3)
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGCONT, signal.SIGUSR2)}
    try:
        JobEnvironment()._handle_signals(paths, delayed)  # what submitit does at a job's start
        with pytest.raises(SystemExit) as requeued:
            fit(tmp_path, every_n_train_steps=None, callbacks=[SignalSelf(signal.SIGUSR2, step=2)])
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)
    assert requeued.value.code == LOCAL_REQUEUE_RETURN_CODE
    assert not isinstance(requeued.value, RunStopped), "submitit ended the job, not vramkit"
    resubmitted = DelayedSubmission.load(paths.submitted_pickle)
    assert resubmitted.args == (["seed=1"],) and resubmitted._timeout_countdown == 3
    saved = torch.load(tmp_path / "last.ckpt", weights_only=True)
    assert saved["global_step"] == 2, "the stop's step, saved before submitit's handler ran"
    _, resumed = fit(tmp_path / "resumed", ckpt_path=tmp_path / "last.ckpt")
    assert same(weights(resumed), final)


def test_step_writes_wait_for_the_minimum_interval(tmp_path, monkeypatch):
    now = [0.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    callback = ResumeCheckpoint(dirpath=str(tmp_path), every_n_train_steps=2, min_interval_s=30)
    written = []
    trainer = SimpleNamespace(
        state=SimpleNamespace(fn=TrainerFn.FITTING), sanity_checking=False, fast_dev_run=False,
        should_stop=False, global_step=0, current_epoch=0, world_size=2, accumulate_grad_batches=1,
        save_checkpoint=lambda path, weights_only=None: written.append(trainer.global_step),
    )  # fmt: skip
    callback.on_train_start(trainer, None)  # the clock starts at 0 s
    for step, seconds in [(2, 10), (4, 29), (5, 35), (6, 40), (8, 60), (10, 71), (12, 80)]:
        trainer.global_step, now[0] = step, seconds
        callback.on_train_batch_end(trainer, None, None, None, step - 1)
    # 5 is no multiple of 2; 6 is the first multiple 30 s after the start, 10 the first 30 s
    # after the write at 6 (40 s)
    assert written == [6, 10]


def test_the_state_key_is_modelcheckpoints_built_once(tmp_path):
    callback = ResumeCheckpoint(dirpath=str(tmp_path))
    assert callback.state_key == ModelCheckpoint.state_key.fget(callback)
    assert callback.state_key is callback.state_key
