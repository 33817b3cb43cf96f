"""Stop signals (SIGTERM, SIGINT, SIGUSR1) as a request that training honours at a step boundary.

A scheduler ends a job with a signal: SLURM sends SIGTERM at preemption or at the time limit
(and SIGUSR1 ahead of it with ``--signal=USR1@<s>``), Colab and cloud shutdowns send SIGTERM, a
user presses Ctrl-C (SIGINT). Python's default reaction ends the process wherever it is (SIGTERM,
SIGUSR1) or raises ``KeyboardInterrupt`` in the middle of a step (SIGINT); Lightning's own SIGTERM
handler ends the run with ``SIGTERMException``, a ``SystemExit`` whose status is 0, so a
scheduler records success (``lightning/pytorch/utilities/exceptions.py``). Here a signal only
records the request; the run's resume checkpoint then writes ``last.ckpt`` at the next boundary
and raises :class:`RunStopped`, whose exit status is 128 + the signal number, the shell's
convention for "ended by a signal".

A SIGUSR1 handler that is already installed is left alone: Lightning installs one when SLURM
auto-requeue is on (``lightning/pytorch/trainer/connectors/signal_connector.py``: it saves an
``hpc_ckpt`` and runs ``scontrol requeue``), and SLURM's SIGTERM that follows the requeue then
stops the run here.

Under submitit (``hydra/launcher=slurm`` or ``local_processes``) the scheduler's warning is
submitit's preemption signal, SIGUSR2 unless ``SUBMITIT_PREEMPT_SIGNAL`` names another
(``submitit/core/job_environment.py``, ``JobEnvironment.USR_SIG``). submitit installs its handler
when the job starts; run there, mid-step, it would requeue the job at once and lose the steps since
the last write. Here that signal is taken over too and *handed over*: the run writes ``last.ckpt``
at the next step boundary, then calls submitit's handler, which resubmits the job (the launcher's
``checkpoint``) and requeues it (exit status 144 under ``submitit_local``, ``scontrol requeue`` on
SLURM).
"""

from __future__ import annotations

import contextlib
import logging
import shlex
import signal
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from types import FrameType
from typing import Any

from vramkit.core.config.source import command_line_overrides

log = logging.getLogger(__name__)

STOP_SIGNALS = ("SIGTERM", "SIGINT", "SIGUSR1")
"""Signals that stop a run at its next step boundary by default."""

_SIGNAL_EXIT_BASE = 128  # exit status of a process ended by signal N: 128 + N (POSIX shells)


class RunStopped(SystemExit):
    """The run stopped on a signal after saving a resumable checkpoint.

    A ``SystemExit`` with status 128 + the signal number: the process ends non-zero without a
    traceback, and ``except Exception`` blocks (Hydra's job runner) let it through.
    """

    def __init__(self, received: signal.Signals, message: str) -> None:
        super().__init__(_SIGNAL_EXIT_BASE + int(received))
        self.signal = received
        self.message = message

    def __str__(self) -> str:
        return self.message


def submitit_preempt_signal(environ: Mapping[str, str]) -> signal.Signals | None:
    """The signal submitit sends a job it is about to stop (time limit near, or preemption), or
    None outside a submitit job.

    submitit marks its jobs with ``SUBMITIT_EXECUTOR`` and reads the signal's name from
    ``SUBMITIT_PREEMPT_SIGNAL`` (default ``USR2``), in ``submitit/core/job_environment.py``.
    """
    if not environ.get("SUBMITIT_EXECUTOR"):
        return None
    name = "SIG" + environ.get("SUBMITIT_PREEMPT_SIGNAL", "USR2")
    return signal.Signals[name] if name in signal.Signals.__members__ else None


def parse_signals(names: Sequence[str]) -> tuple[signal.Signals, ...]:
    """``("SIGTERM", "SIGINT")`` → the signals, refusing a name this platform lacks."""
    known = {member.name for member in signal.Signals}
    unknown = [name for name in names if name not in known]
    if unknown:
        raise ValueError(
            f"unknown signal name(s) {unknown}; stop signals are names like {list(STOP_SIGNALS)}"
        )
    return tuple(signal.Signals[name] for name in names)


class StopSignals:
    """Handlers that record the first stop signal instead of ending the process.

    A second SIGINT (Ctrl-C pressed again) raises ``KeyboardInterrupt`` at once, for a user who
    does not want to wait for the step to finish.

    ``hand_over`` signals keep a use for their previous handler: :meth:`hand_over` calls it once
    the run has saved (submitit's checkpoint-and-requeue, see the module's note).
    """

    def __init__(
        self, signals: Sequence[signal.Signals], hand_over: Sequence[signal.Signals] = ()
    ) -> None:
        self.signals = tuple(dict.fromkeys([*signals, *hand_over]))
        self.hand_over_signals = tuple(hand_over)
        self.received: signal.Signals | None = None
        self._previous: dict[signal.Signals, Any] = {}

    def install(self) -> list[signal.Signals]:
        """Take over the signals (main thread only; elsewhere nothing changes); the taken ones.

        SIGUSR1 is taken only when nobody handles it yet (see the module's note on SLURM).
        """
        if threading.current_thread() is not threading.main_thread() or self._previous:
            return list(self._previous)
        self.received = None
        for signum in self.signals:
            current = signal.getsignal(signum)
            handled = current not in (signal.SIG_DFL, None)
            if signum == signal.SIGUSR1 and handled and signum not in self.hand_over_signals:
                log.debug("SIGUSR1 keeps its handler %r (SLURM auto-requeue)", current)
                continue
            self._previous[signum] = current
            signal.signal(signum, self._handle)
        return list(self._previous)

    def uninstall(self) -> None:
        """Give the signals their previous handlers back."""
        if threading.current_thread() is not threading.main_thread():
            return
        for signum, handler in self._previous.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
        self._previous = {}

    def hand_over(self) -> None:
        """Call the handler the received signal had before :meth:`install`, when it is one of
        ``hand_over``'s; it may end the process (submitit requeues with ``SystemExit``)."""
        received = self.received
        if received is None or received not in self.hand_over_signals:
            return
        previous = self._previous.get(received)
        if callable(previous):
            log.info("%s: handing over to %r", received.name, previous)
            previous(int(received), None)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        received = signal.Signals(signum)
        if self.received is not None:
            if received == signal.SIGINT:
                self.uninstall()
                raise KeyboardInterrupt
            return
        self.received = received
        log.warning(
            "%s received: the run stops after the current step, with a resumable checkpoint%s",
            received.name,
            " (Ctrl-C again to quit at once)" if received == signal.SIGINT else "",
        )


@contextlib.contextmanager
def stops_at_once(stopped: Callable[[signal.Signals], str]) -> Iterator[None]:
    """SIGTERM and SIGINT end the block at once with :class:`RunStopped` (exit status 143 / 130).

    For the entry points with nothing to resume (``eval.py``, ``scripts/export.py``): their
    outputs are written atomically at the end, so a stop wastes only the work since the start and
    leaves no half-written file. Python's own reactions would report otherwise: SIGINT raises
    ``KeyboardInterrupt``, which Lightning turns into ``exit(1)``, and Lightning's SIGTERM handler
    (``signal_connector.py``, installed by every ``trainer.validate`` / ``predict``, which keeps
    and calls the handler it finds, this one) ends validation with ``SIGTERMException``, status 0
    (``loops/evaluation_loop.py``), and lets prediction run to its end. ``stopped(signal)`` is
    the one line logged: what stopped and the command that runs it again. A second signal while
    the block unwinds is ignored. Outside the main thread nothing changes.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[signal.Signals] = []

    def handle(signum: int, frame: FrameType | None) -> None:
        if received:
            return  # already on the way out
        received.append(signal.Signals(signum))
        raise RunStopped(received[0], stopped(received[0]))

    previous = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGINT)}
    for signum in previous:
        signal.signal(signum, handle)
    try:
        yield
    except RunStopped as stop:
        log.warning("%s", stop)
        raise
    except BaseException:
        if not received:
            raise
        # The stop raised inside a library that wrapped it in an error of its own (an
        # interrupted `import onnxruntime` re-raises its import error from it): still the stop.
        stop = RunStopped(received[0], stopped(received[0]))
        log.warning("%s", stop)
        raise stop from None
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)


def rerun_command(script: str) -> str:
    """The command that runs this Hydra app again as the user typed it:
    ``python eval.py ckpt_path=… +hw=t4`` (overrides quoted for a POSIX shell)."""
    return shlex.join(["python", script, *command_line_overrides()])
