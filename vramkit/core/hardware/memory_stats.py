"""Read and reset what the process uses: CUDA allocator statistics or the host's resident set."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")


@dataclass(frozen=True)
class MemoryReading:
    """Memory of one device at one moment, in bytes.

    CUDA: ``peak`` is the allocator's peak of allocated bytes since the last reset,
    ``current`` what is allocated now, ``reserved_peak`` the peak held by the caching allocator.
    CPU: ``peak`` is the resident set's high-water mark (VmHWM) since the last reset,
    ``current`` the resident set size (VmRSS), ``reserved_peak`` None.
    """

    peak: int
    current: int
    reserved_peak: int | None = None

    def merged(self, later: MemoryReading) -> MemoryReading:
        """The peaks of both readings, the current value of the later one."""
        reserved = (
            None
            if self.reserved_peak is None and later.reserved_peak is None
            else max(self.reserved_peak or 0, later.reserved_peak or 0)
        )
        return MemoryReading(max(self.peak, later.peak), later.current, reserved)


def read_host_memory(status: Path = _STATUS) -> MemoryReading | None:
    """VmHWM and VmRSS of this process from ``/proc/self/status``; None where there is none."""
    try:
        text = status.read_text()
    except OSError:
        return None
    fields = {}
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name in ("VmHWM", "VmRSS"):
            number, unit = value.split()
            if unit != "kB":
                raise ValueError(f"{status}: {name} is in {unit!r}, expected kB")
            fields[name] = int(number) * 1024
    if set(fields) != {"VmHWM", "VmRSS"}:
        return None
    return MemoryReading(peak=fields["VmHWM"], current=fields["VmRSS"])


def reset_host_peak(clear_refs: Path = _CLEAR_REFS) -> bool:
    """Reset VmHWM to the current resident set (Linux >= 4.0: write 5 to clear_refs).

    Returns False where the kernel does not offer it; VmHWM then counts from process start.
    """
    try:
        clear_refs.write_text("5")
    except OSError:
        return False
    return True


def read_cuda_memory(device: torch.device) -> MemoryReading:
    """The CUDA caching allocator's statistics for ``device`` (bytes).

    One ``memory_stats`` call: ``max_memory_allocated``, ``memory_allocated`` and
    ``max_memory_reserved`` each build the whole statistics dict and read one key of it
    (torch/cuda/memory.py), so three calls would cost three dicts per reading.
    """
    stats = torch.cuda.memory_stats(device)
    return MemoryReading(
        peak=stats.get("allocated_bytes.all.peak", 0),
        current=stats.get("allocated_bytes.all.current", 0),
        reserved_peak=stats.get("reserved_bytes.all.peak", 0),
    )
