import torch

from vramkit.core.hardware import memory_stats
from vramkit.core.hardware.memory_stats import read_cuda_memory


def test_read_cuda_memory_reads_the_allocator_statistics_once(monkeypatch):
    calls = []
    stats = {
        "allocated_bytes.all.peak": 3 << 30,
        "allocated_bytes.all.current": 1 << 30,
        "reserved_bytes.all.peak": 4 << 30,
    }

    def fake_memory_stats(device):
        calls.append(device)
        return stats

    monkeypatch.setattr(memory_stats.torch.cuda, "memory_stats", fake_memory_stats)
    reading = read_cuda_memory(torch.device("cuda", 0))
    assert (reading.peak, reading.current, reading.reserved_peak) == (3 << 30, 1 << 30, 4 << 30)
    assert calls == [torch.device("cuda", 0)]
