"""Standard error held back while Hydra composes, so a refusal of the command line can replace
Hydra's own lines instead of following them.

Hydra reports a composition error itself, before any task code runs: ``run_and_report`` in
``hydra/_internal/utils.py`` writes the error, its cause and "Set the environment variable
HYDRA_FULL_ERROR=1 ..." to ``sys.stderr`` and exits with status 1. Nothing printed can be taken
back, so `hold_stderr` keeps what is written to standard error until the run starts
(`release_stderr`, called as the task function begins) or the entry point ends; a caller that
replaces Hydra's report `discard`s it. Everything held is written out in order otherwise.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any, TextIO


class HeldStream:
    """A text stream that keeps what is written until released, then writes through.

    Other attributes (``isatty``, ``fileno``, ``encoding``) are the wrapped stream's: a logging
    handler created while holding keeps writing to the real stream after the release.
    """

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.holding = True
        self._held: list[str] = []

    def write(self, text: str) -> int:
        """Keep ``text`` while holding, else write it to the wrapped stream; its length."""
        if self.holding:
            self._held.append(text)
            return len(text)
        return self.stream.write(text)

    def flush(self) -> None:
        """Flush the wrapped stream once released (nothing to flush while holding)."""
        if not self.holding:
            self.stream.flush()

    def release(self) -> None:
        """Write what was held, in order, and write through from now on."""
        if self.holding:
            self.holding = False
            self.stream.write("".join(self._held))
            self._held = []
            self.stream.flush()

    def discard(self) -> str:
        """Drop what was held (its text is returned) and write through from now on."""
        held, self._held, self.holding = "".join(self._held), [], False
        return held

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


_held: HeldStream | None = None


@contextlib.contextmanager
def hold_stderr() -> Iterator[HeldStream]:
    """Hold ``sys.stderr`` inside the block until `release_stderr`; released at the block's end."""
    global _held
    held = _held = HeldStream(sys.stderr)
    sys.stderr = held
    try:
        yield held
    finally:
        release_stderr()


def release_stderr() -> None:
    """The run has started: write what is held and give ``sys.stderr`` back (no-op when nothing
    is held)."""
    global _held
    held, _held = _held, None
    if held is None:
        return
    held.release()
    if sys.stderr is held:
        sys.stderr = held.stream
