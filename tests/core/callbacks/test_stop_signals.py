"""Stop signals are recorded, not obeyed on the spot; Ctrl-C twice quits; SLURM keeps SIGUSR1."""

from __future__ import annotations

import os
import signal

import pytest

from vramkit.core.callbacks.stop_signals import RunStopped, StopSignals, parse_signals


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
