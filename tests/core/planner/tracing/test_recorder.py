"""The recorder's peak: the live set at the moment of the peak, whatever happens after it."""

from __future__ import annotations

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from vramkit.core.planner.tracing.peak_holders import WORKSPACE
from vramkit.core.planner.tracing.recorder import ACTIVATIONS, PARAMETERS, StorageRecorder


def _serial(recorder: StorageRecorder, tensor: torch.Tensor) -> int:
    return recorder._serial_of[tensor.untyped_storage()._cdata]


def test_the_peak_keeps_what_was_live_then_not_what_came_later():
    with StorageRecorder() as recorder:
        first = torch.empty(100, dtype=torch.uint8)
        second = torch.empty(50, dtype=torch.uint8)  # the peak: 150 bytes
        peak_serials = {_serial(recorder, first), _serial(recorder, second)}
        empty = torch.empty(0, dtype=torch.uint8)  # live at the same total, after the peak
        later = _serial(recorder, empty)
        del second
        small = torch.empty(10, dtype=torch.uint8)
        del small, empty
    recorder.close()
    assert recorder.peak.bytes == 150
    assert set(recorder.peak.live) == peak_serials
    assert later not in recorder.peak.live
    assert recorder.peak_breakdown()[ACTIVATIONS] == 150
    del first


def test_leaving_out_a_tensor_takes_it_out_of_the_peak_it_raised():
    with StorageRecorder() as recorder:
        kept = torch.empty(100, dtype=torch.uint8)
        host = torch.empty(30, dtype=torch.uint8)  # raises the peak to 130 bytes
        recorder.leave_out([host])
    recorder.close()
    assert recorder.peak.bytes == 100
    assert set(recorder.peak.live) == {_serial(recorder, kept)}
    assert recorder.events == [(_serial(recorder, kept), 100)]


def test_a_fake_tensor_reports_its_fake_device_under_the_recorder():
    with FakeTensorMode(allow_non_fake_inputs=True), StorageRecorder() as recorder:
        on_gpu = torch.empty(4, device="cuda")
        moved = on_gpu * 2  # the op's device checks ask the recorder for both devices
    recorder.close()
    assert on_gpu.device.type == "cuda"
    assert moved.device.type == "cuda"
    assert recorder.peak.bytes == 2 * 4 * 4


def test_the_breakdown_at_the_workspace_moment_names_the_workspace_apart():
    with StorageRecorder() as recorder:
        weights = torch.empty(100, dtype=torch.uint8)
        recorder.register([weights], PARAMETERS)
        temporary = torch.empty(40, dtype=torch.uint8)  # the peak: 140 bytes
        del temporary
        activation = torch.empty(20, dtype=torch.uint8)
        recorder.charge_workspace(60)  # 180 bytes while the op runs
        del activation
    recorder.close()
    assert recorder.peak_breakdown()[ACTIVATIONS] == 40
    at_workspace = recorder.peak_breakdown(with_workspaces=True)
    assert (at_workspace[PARAMETERS], at_workspace[ACTIVATIONS]) == (100, 20)
    assert at_workspace[WORKSPACE] == 60
    assert sum(at_workspace.values()) == recorder.peak_with_workspaces.bytes == 180
    del weights
