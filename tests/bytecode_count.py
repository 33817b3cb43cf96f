"""How many Python bytecodes a call runs: a cost figure that load does not move."""

from __future__ import annotations

import sys
from collections.abc import Callable
from types import FrameType
from typing import Any


def bytecodes(call: Callable[[], Any]) -> int:
    """Python bytecodes ``call`` runs (opcode tracing: the same count on a busy machine)."""
    count = 0

    def local(frame: FrameType, event: str, arg: Any) -> Any:
        nonlocal count
        if event == "opcode":
            count += 1
        return local

    def start(frame: FrameType, event: str, arg: Any) -> Any:
        frame.f_trace_opcodes = True
        return local

    sys.settrace(start)
    try:
        call()
    finally:
        sys.settrace(None)
    return count
