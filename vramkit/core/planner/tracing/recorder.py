"""Live-storage accounting: a dispatch mode that sees every allocation and every free.

`StorageRecorder` watches the outputs of every op that runs while it is active. A storage it has
not seen is an allocation (its size rounded as the CUDA caching allocator rounds it); a weakref
finalizer on the storage tells when the last tensor or view using it is gone, which is when the
allocator would get the block back. The same recorder measures real tensors and fake ones, so a
trace of fake tensors can be checked against a real run measured the same way.

Each storage gets a category: `parameters` (parameters and buffers), `inputs` (the batch),
`gradients`, `optimizer_state`, or `activations` (everything else: saved activations and
temporaries). Gradients and optimizer states are only known once a hook or the optimizer shows
them, so the peak keeps the storages live at that moment and categories are resolved at the end.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from vramkit.core.planner.tracing.peak_holders import (
    OUTSIDE,
    SAVED_ACTIVATION,
    TEMPORARY,
    WORKSPACE,
    Holder,
    ModuleScope,
    group_holders,
)

PARAMETERS = "parameters"
INPUTS = "inputs"
GRADIENTS = "gradients"
OPTIMIZER_STATE = "optimizer_state"
ACTIVATIONS = "activations"
CATEGORIES = (PARAMETERS, GRADIENTS, OPTIMIZER_STATE, INPUTS, ACTIVATIONS)

_DEVICE_QUERY = torch.ops.prim.device.default

ALLOC = "alloc"
FREE = "free"
LEAVE = "leave"
RESET = "reset"
"""The kinds of entries in `StorageRecorder.log`."""


@dataclass
class RecordedPeak:
    """The most bytes live at once, when it happened, and what was live then."""

    bytes: int = 0
    label: str = ""
    live: dict[int, int] = field(default_factory=dict)
    """Storage serial → bytes, for every storage live at the peak."""


class StorageRecorder(TorchDispatchMode):
    """Count live storage bytes through whatever runs while the mode is active.

    `round_bytes` maps a storage's size to what the device allocator hands out for it (identity
    for plain bytes). With `keep_timeline`, `timeline` keeps the live total after every op that
    changed it.
    Call `close()` when done: it detaches the finalizers from storages that outlive the trace.
    """

    def __init__(
        self,
        *,
        round_bytes: Callable[[int], int] = lambda n: n,
        keep_timeline: bool = False,
    ) -> None:
        super().__init__()
        self.round_bytes = round_bytes
        self.keep_timeline = keep_timeline
        self.timeline: list[int] = []
        self.current = 0
        self._peak = RecordedPeak()
        # A new peak's live set is copied when something is freed, not at every allocation
        # that raises the peak: while the optimizer creates its state the peak rises with each
        # of thousands of allocations, and copying the live set each time is quadratic.
        self._unsnapshotted: RecordedPeak | None = None
        self.peak_with_workspaces = self._peak
        """`peak` with the workspace each op held while it ran (`charge_workspace`); the same
        object as `peak` until a workspace rises above it."""
        self.op_names: set[str] = set()
        self._label = ""
        self._next_serial = 0
        self._serial_of: dict[int, int] = {}  # storage address (`_cdata`) → serial
        self._live: dict[int, int] = {}  # serial → bytes
        self._category: dict[int, str] = {}  # serial → category (activations when absent)
        self._finalizers: dict[int, weakref.finalize] = {}
        # For explaining the peak: where each storage was made (module, shape, dtype), which
        # ones autograd saved for backward, and the modules' names while `attribute_to` runs.
        self._origin: dict[int, tuple[str, tuple[int, ...], torch.dtype]] = {}
        self._saved: set[int] = set()
        self._workspaces: set[int] = set()
        self._scope: ModuleScope | None = None
        self._owners: dict[int, str] = {}
        self.events: list[tuple[int, int]] = []
        """Every allocation (serial, bytes) and free (serial, 0) in order, for the allocator."""
        self.log: list[tuple] = []
        """Every change of the live set in order, zero-byte storages included: (ALLOC, serial,
        bytes, phase label), (FREE, serial), (LEAVE, serial) for `leave_out`, (RESET, label) for
        `reset_peak`. Replaying it through `replay` remakes the recorder's peaks and events
        (`block_extrapolation` rebuilds an N-block step's log from shorter ones)."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # torch wraps a mode's __torch_dispatch__ in `torch._dynamo.disable` unless this says
        # False (torch/utils/_python_dispatch.py, `TorchDispatchMode.__init_subclass__`). The
        # wrapper only matters under torch.compile, which a trace never runs, and it costs
        # several calls on each of the ~50,000 dispatches of a Phi-1.5 step, device queries
        # included.
        return False

    @property
    def peak(self) -> RecordedPeak:
        """The most bytes live at once so far, with what was live then."""
        self._snapshot_peak()
        return self._peak

    @peak.setter
    def peak(self, value: RecordedPeak) -> None:
        self._snapshot_peak()
        self._peak = value

    def _snapshot_peak(self) -> None:
        """Give the latest peak its live set, before that set changes other than by growing
        the peak further."""
        if self._unsnapshotted is not None:
            self._unsnapshotted.live = dict(self._live)
            self._unsnapshotted = None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is _DEVICE_QUERY:
            # Fake tensors ask for their device (tens of thousands of times in a large model's
            # step); no memory. A fake tensor's `device` property gives what the fake mode would
            # answer (`_device_handler` in torch/_subclasses/fake_tensor.py) without another
            # round through the dispatcher.
            tensor = args[0] if len(args) == 1 else None
            if type(tensor) is FakeTensor:
                return tensor.device
            return func(*args, **(kwargs or {}))
        out = self.run_op(func, args, kwargs or {})
        self.op_names.add(func.__name__)
        if isinstance(out, torch.Tensor):
            self._track(out)  # most ops: one tensor, no tree to flatten
        else:
            for value in tree_flatten(out)[0]:
                if isinstance(value, torch.Tensor):
                    self._track(value)
        if self.keep_timeline and (not self.timeline or self.timeline[-1] != self.current):
            self.timeline.append(self.current)
        return out

    def run_op(self, func: Any, args: tuple, kwargs: dict) -> Any:
        """Run one op; subclasses intercept ops that cannot run as they are."""
        return func(*args, **kwargs)

    @contextlib.contextmanager
    def phase(self, label: str) -> Iterator[None]:
        """Name what runs inside (e.g. "step 2: backward"), so the peak says where it was."""
        outer, self._label = self._label, label
        try:
            yield
        finally:
            self._label = outer

    def register(
        self,
        tensors: Iterable[torch.Tensor | None],
        category: str,
        *,
        owners: Iterable[torch.Tensor] | None = None,
    ) -> None:
        """Count `tensors` under `category`: ones that exist already (parameters, the batch)
        or ones the trace learns the role of later (a new gradient, an optimizer state).

        `owners` (parallel to `tensors`) are the parameters they belong to, which name the
        module they are shown under when the peak is explained.
        """
        owner_list = list(owners) if owners is not None else None
        for index, tensor in enumerate(tensors):
            if tensor is None:
                continue
            serial = self._track(tensor)
            if serial is None:
                continue
            self._category[serial] = category
            owner = tensor if owner_list is None else owner_list[index]
            where = self._owners.get(id(owner))
            if where is not None:
                _, shape, dtype = self._origin[serial]
                self._origin[serial] = (where, shape, dtype)

    @contextlib.contextmanager
    def attribute_to(self, root: nn.Module) -> Iterator[None]:
        """While inside, remember which module of `root` made each storage (`peak_holders`)."""
        scope = ModuleScope()
        self._owners = scope.owner_of(root)
        with scope.track(root):
            self._scope = scope
            try:
                yield
            finally:
                self._scope = None

    def charge_workspace(self, nbytes: int) -> None:
        """Count `nbytes` of library workspace held for the op running now, as a kernel that
        takes a scratch block from the caching allocator for one call does (cuDNN convolutions).

        Such a kernel takes it only from memory that is free: on an out-of-memory error it runs
        another engine with a smaller one (Conv_v8.cpp, `try_configs`). So the workspace counts
        towards `peak_with_workspaces` (what `max_memory_allocated` reads with memory to spare),
        not towards `peak`, the bytes a run cannot do without.
        """
        size = self.round_bytes(nbytes)
        if size <= 0 or self.current + size <= self.peak_with_workspaces.bytes:
            return
        serial = self._next_serial
        self._next_serial += 1
        self._workspaces.add(serial)
        self._origin[serial] = (self._where(), (nbytes,), torch.uint8)
        live = {**self._live, serial: size}
        self.peak_with_workspaces = RecordedPeak(self.current + size, self._label, live)

    def leave_out(self, tensors: Iterable[torch.Tensor]) -> None:
        """Stop counting `tensors` as device memory: a CUDA run keeps them on the host.

        They leave the live total, the allocation events and the recorded peak (the peak then
        reads the device bytes at that moment; another moment within their few bytes of it may
        have been higher). Registering them later changes nothing.
        """
        gone: set[int] = set()
        for tensor in tensors:
            serial = self._track(tensor)
            if serial is not None and self._leave(serial):
                gone.add(serial)
        if gone:
            self.events = [event for event in self.events if event[0] not in gone]

    def _leave(self, serial: int) -> bool:
        """Take `serial` out of the live set and the recorded peaks; whether it was live. The
        caller takes it out of `events`."""
        self._snapshot_peak()  # before the live set shrinks
        if serial not in self._live:
            return False
        self.log.append((LEAVE, serial))
        size = self._live.pop(serial)
        self.current -= size
        for recorded in {id(p): p for p in (self.peak, self.peak_with_workspaces)}.values():
            if recorded.live.pop(serial, None) is not None:
                recorded.bytes -= size
        if self.peak_with_workspaces.bytes < self.peak.bytes:  # keep it the larger of the two
            self.peak_with_workspaces = self.peak
        return True

    def note_forward_end(self) -> None:
        """Mark the activations alive now, at the end of a forward pass, as saved for backward.

        What the forward made and still holds is what autograd saved (and the outputs); the
        rest were temporaries. Reading the graph's saved tensors instead would unpack them, which
        reruns checkpointed forwards and copies `save_on_cpu` tensors back.
        """
        for serial in self._live:
            if self._category.get(serial, ACTIVATIONS) == ACTIVATIONS:
                self._saved.add(serial)

    def peak_holders(self, top: int = 8, *, with_workspaces: bool = False) -> tuple[Holder, ...]:
        """The largest groups of storages live at the peak (or at `peak_with_workspaces`), by
        module and kind."""
        self._snapshot_peak()  # `peak_with_workspaces` may be the latest peak
        peak = self.peak_with_workspaces if with_workspaces else self.peak
        kinds = {}
        for serial in peak.live:
            category = self._category.get(serial)
            if serial in self._workspaces:
                kinds[serial] = WORKSPACE
            elif category is not None and category != ACTIVATIONS:
                kinds[serial] = category
            else:
                kinds[serial] = SAVED_ACTIVATION if serial in self._saved else TEMPORARY
        return group_holders(peak.live, self._origin, kinds, top=top)

    def reset_peak(self) -> None:
        """Start a new peak from what is live now (the next phase's measurement)."""
        self.log.append((RESET, self._label))
        self.peak = RecordedPeak(self.current, self._label, dict(self._live))
        self.peak_with_workspaces = self.peak

    def peak_breakdown(self, *, with_workspaces: bool = False) -> dict[str, int]:
        """Bytes live at the peak, by category (every category present, zeros included).

        `with_workspaces`: at `peak_with_workspaces` instead, the workspace held then under
        `WORKSPACE` (0 when no workspace rises above the peak)."""
        self._snapshot_peak()
        peak = self.peak_with_workspaces if with_workspaces else self.peak
        totals = dict.fromkeys(CATEGORIES, 0)
        if with_workspaces:
            totals[WORKSPACE] = 0
        for serial, size in peak.live.items():
            category = WORKSPACE if serial in self._workspaces else None
            totals[category or self._category.get(serial, ACTIVATIONS)] += size
        return totals

    def close(self) -> None:
        """Stop tracking: storages that outlive the trace no longer call back."""
        for finalizer in self._finalizers.values():
            finalizer.detach()
        self._finalizers.clear()

    def _track(self, tensor: torch.Tensor) -> int | None:
        try:
            storage = tensor.untyped_storage()
        except (NotImplementedError, RuntimeError):
            return None  # sparse, nested or other storage-less layouts: nothing to count
        address = storage._cdata
        serial = self._serial_of.get(address)
        if serial is not None:
            return serial
        serial = self._add(
            self.round_bytes(storage.nbytes()), (self._where(), tuple(tensor.shape), tensor.dtype)
        )
        self._serial_of[address] = serial
        self._finalizers[serial] = weakref.finalize(storage, self._free, address, serial)
        return serial

    def _add(self, size: int, origin: tuple[str, tuple[int, ...], torch.dtype]) -> int:
        """Count a new storage of `size` bytes made at `origin`; its serial."""
        raises_peak = self.current + size > self._peak.bytes
        if not raises_peak:
            self._snapshot_peak()  # the latest peak's live set does not hold this storage
        serial = self._next_serial
        self._next_serial += 1
        self._live[serial] = size
        self.log.append((ALLOC, serial, size, self._label))
        if size:
            self.events.append((serial, size))
        self._origin[serial] = origin
        self.current += size
        if raises_peak:
            self._peak = self._unsnapshotted = RecordedPeak(self.current, self._label)
        if self.current > self.peak_with_workspaces.bytes:
            self.peak_with_workspaces = self._peak  # above every workspace: the peak itself
        return serial

    def _where(self) -> str:
        if self._scope is None:
            return OUTSIDE
        return self._scope.current(in_backward=torch._C._current_graph_task_id() != -1)

    def _free(self, address: int, serial: int) -> None:
        self._remove(serial)
        if self._serial_of.get(address) == serial:
            del self._serial_of[address]
        self._finalizers.pop(serial, None)

    def _remove(self, serial: int) -> None:
        """The storage `serial` is gone: its block goes back to the allocator."""
        self._snapshot_peak()
        if serial in self._live:
            self.log.append((FREE, serial))
        size = self._live.pop(serial, 0)
        self.current -= size
        if size:
            self.events.append((serial, 0))
