"""Stop signals are recorded, not obeyed on the spot; Ctrl-C twice quits; SLURM keeps SIGUSR1;
submitit's preemption signal is handed to submitit once the run has saved."""

from __future__ import annotations

import os
import signal

import pytest

from vramkit.core.callbacks.stop_signals import (
    RunStopped,
    StopSignals,
    parse_signals,
    stops_at_once,
    submitit_preempt_signal,
)


@pytest.fixture
def stop_signals():
    signals = StopSignals(parse_signals(["SIGTERM", "SIGINT", "SIGUSR1"]))
    yield signals
    signals.uninstall()


def test_a_signal_is_recorded_and_the_process_goes_on(stop_signals):
    assert set(stop_signals.install()) == {signal.SIGTERM, signal.SIGINT, signal.SIGUSR1}
    os.kill(os.getpid(), signal.SIGTERM)
    os.kill(os.getpid(), signal.SIGUSR1)  # a later signal does not replace the first
    assert stop_signals.received == signal.SIGTERM


def test_a_second_ctrl_c_quits_at_once(stop_signals):
    stop_signals.install()
    os.kill(os.getpid(), signal.SIGINT)
    assert stop_signals.received == signal.SIGINT
    with pytest.raises(KeyboardInterrupt):
        os.kill(os.getpid(), signal.SIGINT)


def test_uninstall_gives_back_the_previous_handlers(stop_signals):
    before = {signum: signal.getsignal(signum) for signum in stop_signals.signals}
    stop_signals.install()
    assert signal.getsignal(signal.SIGTERM) != before[signal.SIGTERM]
    stop_signals.uninstall()
    assert {signum: signal.getsignal(signum) for signum in stop_signals.signals} == before


def test_an_installed_sigusr1_handler_is_left_to_its_owner(stop_signals):
    calls = []
    previous = signal.signal(signal.SIGUSR1, lambda signum, frame: calls.append(signum))
    try:
        assert signal.SIGUSR1 not in stop_signals.install()
        os.kill(os.getpid(), signal.SIGUSR1)
        assert calls == [signal.SIGUSR1] and stop_signals.received is None
    finally:
        stop_signals.uninstall()
        signal.signal(signal.SIGUSR1, previous)


def test_the_exit_status_is_128_plus_the_signal():
    stopped = RunStopped(signal.SIGTERM, "stopped")
    assert isinstance(stopped, SystemExit) and stopped.code == 143 and str(stopped) == "stopped"


def test_an_unknown_signal_name_is_refused_with_the_known_ones():
    with pytest.raises(ValueError, match=r"SIGTREM.*SIGTERM"):
        parse_signals(["SIGTREM"])


def test_submitits_preemption_signal_is_usr2_unless_it_names_another():
    assert submitit_preempt_signal({}) is None, "not a submitit job"
    assert submitit_preempt_signal({"SUBMITIT_EXECUTOR": "slurm"}) == signal.SIGUSR2
    job = {"SUBMITIT_EXECUTOR": "local", "SUBMITIT_PREEMPT_SIGNAL": "USR1"}
    assert submitit_preempt_signal(job) == signal.SIGUSR1


def test_a_handed_over_signal_runs_its_previous_handler_only_when_asked():
    """submitit's checkpoint-and-requeue handler waits for the step boundary, then runs."""
    calls = []
    previous = signal.signal(signal.SIGUSR2, lambda signum, frame: calls.append(signum))
    stop = StopSignals(parse_signals(["SIGTERM"]), hand_over=(signal.SIGUSR2,))
    try:
        assert set(stop.install()) == {signal.SIGTERM, signal.SIGUSR2}
        os.kill(os.getpid(), signal.SIGUSR2)
        assert stop.received == signal.SIGUSR2 and calls == [], "nothing happens mid-step"
        stop.hand_over()
        assert calls == [signal.SIGUSR2]
    finally:
        stop.uninstall()
        signal.signal(signal.SIGUSR2, previous)


def test_a_signal_that_is_not_handed_over_keeps_its_previous_handler_unused():
    calls = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: calls.append(signum))
    stop = StopSignals(parse_signals(["SIGTERM"]), hand_over=(signal.SIGUSR2,))
    try:
        stop.install()
        os.kill(os.getpid(), signal.SIGTERM)
        stop.hand_over()
        assert stop.received == signal.SIGTERM and calls == []
    finally:
        stop.uninstall()
        signal.signal(signal.SIGTERM, previous)


def test_submitit_and_lightning_requeue_on_different_signals(tmp_path):
    """Only submitit requeues a job of hydra/launcher=slurm: its sbatch asks SLURM for SIGUSR2,
    and Lightning's SLURM auto-requeue listens for SIGUSR1 (its handler never runs)."""
    from lightning.fabric.plugins.environments import SLURMEnvironment
    from submitit.slurm.slurm import _make_sbatch_string

    sbatch = _make_sbatch_string(command="python x.py", folder=tmp_path, signal_delay_s=120)
    assert "#SBATCH --signal=USR2@120" in sbatch
    assert SLURMEnvironment().requeue_signal == signal.SIGUSR1


def test_a_stop_a_library_wraps_in_its_own_error_is_still_the_stop():
    # A SIGTERM during `import onnxruntime` (export) came out as its ImportError, exit 1.
    with pytest.raises(RunStopped) as stop, stops_at_once(lambda received: f"{received.name}"):
        try:
            os.kill(os.getpid(), signal.SIGTERM)
        except RunStopped as error:
            raise ImportError("the library's own error") from error
    assert stop.value.code == 128 + signal.SIGTERM
    assert signal.getsignal(signal.SIGTERM) is not None


def test_an_error_without_a_signal_passes_through_stops_at_once():
    with pytest.raises(ImportError), stops_at_once(lambda received: f"{received.name}"):
        raise ImportError("not a stop")
