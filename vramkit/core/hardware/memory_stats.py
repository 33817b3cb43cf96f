"""Read and reset what the process uses: CUDA allocator statistics or the host's resident set."""

from __future__ import annotations

import re
import resource
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


_MEMINFO = Path("/proc/meminfo")
_CGROUP_LIMITS = (
    # cgroup v2, then v1: the group's limit and what it uses now
    (Path("/sys/fs/cgroup/memory.max"), Path("/sys/fs/cgroup/memory.current")),
    (
        Path("/sys/fs/cgroup/memory/memory.limit_in_bytes"),
        Path("/sys/fs/cgroup/memory/memory.usage_in_bytes"),
    ),
)
_NO_LIMIT = 2**60  # cgroup v1 writes 9223372036854771712 for "no limit"


@dataclass(frozen=True)
class HostRoom:
    """What this process may still grow into on the host, in bytes, and what limits it."""

    room: int
    """The least of: MemAvailable (other processes already left out), the cgroup's limit minus
    its usage, and the address space an RLIMIT_AS (`ulimit -v`) leaves unmapped."""
    own: int
    """This process's resident set (VmRSS)."""
    source: str
    """Which limit `room` is, e.g. "MemAvailable 21.30 GiB"."""

    @property
    def total(self) -> int:
        """The memory this process may hold in all: its own plus `room` (bytes)."""
        return self.own + self.room


def read_host_room(
    meminfo: Path = _MEMINFO,
    status: Path = _STATUS,
    cgroup_limits: tuple[tuple[Path, Path], ...] = _CGROUP_LIMITS,
) -> HostRoom | None:
    """The host's room for this process now; None where /proc cannot be read (not Linux)."""
    available = _kib_field(meminfo, "MemAvailable")
    own = _kib_field(status, "VmRSS")
    if available is None or own is None:
        return None
    room, source = available, f"MemAvailable {available / 2**30:.2f} GiB"
    for limit_path, usage_path in cgroup_limits:
        limit, usage = _read_int(limit_path), _read_int(usage_path)
        if limit is None or usage is None or limit >= _NO_LIMIT:
            continue
        if limit - usage < room:
            room = max(limit - usage, 0)
            source = f"cgroup limit {limit / 2**30:.2f} GiB - used {usage / 2**30:.2f} GiB"
        break
    limit, _ = resource.getrlimit(resource.RLIMIT_AS)
    mapped = _kib_field(status, "VmSize")
    if limit != resource.RLIM_INFINITY and mapped is not None and limit - mapped < room:
        room = max(limit - mapped, 0)
        source = (
            f"address-space limit (ulimit -v) {limit / 2**30:.2f} GiB, {room / 2**30:.2f} unmapped"
        )
    return HostRoom(room=room, own=own, source=source)


@dataclass(frozen=True)
class HostLimit:
    """The most memory this process could ever hold on the host (bytes), and what says so."""

    limit: int
    """MemTotal, or the cgroup's memory limit where that is lower."""
    source: str
    """E.g. "MemTotal 23.43 GiB" or "cgroup limit 8.00 GiB"."""


def read_host_limit(
    meminfo: Path = _MEMINFO, cgroup_limits: tuple[tuple[Path, Path], ...] = _CGROUP_LIMITS
) -> HostLimit | None:
    """The host's memory for any process of this cgroup; None where /proc cannot be read."""
    total = _kib_field(meminfo, "MemTotal")
    if total is None:
        return None
    found = HostLimit(total, f"MemTotal {total / 2**30:.2f} GiB")
    for limit_path, _ in cgroup_limits:
        limit = _read_int(limit_path)
        if limit is None or limit >= _NO_LIMIT:
            continue
        if limit < found.limit:
            found = HostLimit(limit, f"cgroup limit {limit / 2**30:.2f} GiB")
        break
    return found


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None  # cgroup v2 writes "max" for no limit


def _kib_field(path: Path, name: str) -> int | None:
    """A "<name>: <n> kB" line of a /proc file, in bytes; None when the file or line is absent."""
    try:
        text = path.read_text()
    except OSError:
        return None
    # One regular-expression search, not a Python loop over the file's ~50 lines: the
    # host-memory guard reads three such fields at a training step boundary.
    found = re.search(rf"^{re.escape(name)}:\s*(\d+)\s+(\S+)\s*$", text, re.MULTILINE)
    if found is None:
        return None
    number, unit = found.groups()
    if unit != "kB":
        raise ValueError(f"{path}: {name} is in {unit!r}, expected kB")
    return int(number) * 1024
