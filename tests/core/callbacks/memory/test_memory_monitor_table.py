"""The memory table says whose memory it shows: on a CPU the main process, its loader workers
counted apart."""

from __future__ import annotations

from types import SimpleNamespace

import torch
from torch.utils.data import DataLoader, TensorDataset

from vramkit.core.callbacks.memory.memory_monitor import MemoryMonitor, loader_workers
from vramkit.core.hardware.memory_stats import MemoryReading
from vramkit.core.units import GIB


def _loader(workers: int) -> DataLoader:
    return DataLoader(TensorDataset(torch.zeros(4, 1)), num_workers=workers)


def test_loader_workers_of_one_loader_a_list_and_a_dict() -> None:
    assert loader_workers(_loader(2)) == 2
    assert loader_workers([_loader(2), _loader(1)]) == 3
    assert loader_workers({"a": _loader(2)}) == 2
    assert loader_workers(None) == 0


def test_on_a_cpu_the_table_names_the_main_process_and_the_workers_left_out() -> None:
    monitor = MemoryMonitor(host_guard_fraction=None)
    monitor._device = torch.device("cpu")
    trainer = SimpleNamespace(train_dataloader=_loader(2), val_dataloaders=[_loader(1)])
    trainer.sanity_checking = False
    monitor.on_train_epoch_start(trainer, None)
    monitor.on_validation_start(trainer, None)
    for phase, peak in (("train", 2.0), ("val", 2.374)):
        monitor.records[phase].run = MemoryReading(int(peak * GIB), int(1.3 * GIB))
        monitor.records[phase].epochs = 1
    lines = monitor.table().splitlines()
    assert "peak RSS, main process" in lines[2] and "loader workers, not counted" in lines[2]
    train = next(line for line in lines if " train " in line)
    val = next(line for line in lines if " val " in line)
    assert "2.000" in train and " 2 " in train
    assert "2.374" in val and " 1 " in val
