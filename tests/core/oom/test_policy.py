"""The OOM decision is the same on every process; batches split along samples; logs merge."""

from __future__ import annotations

from collections import namedtuple

import pytest
import torch

from vramkit.core.data.batches import batch_size_of
from vramkit.core.oom.batch_split import slice_batch
from vramkit.core.oom.log_buffer import LogBuffer
from vramkit.core.oom.policy import Action, Decision, decide, halve


def test_a_first_failure_halves_and_a_second_one_of_the_same_step_is_the_last_resort():
    assert decide(8, 0) == Decision(Action.SPLIT, 4)
    assert decide(4, 1) == Decision(Action.LAST_RESORT, 2)
    assert decide(4, 1, last_resort=False) == Decision(Action.SPLIT, 2)  # validation
    assert decide(1, 0).action is Action.GIVE_UP


def test_halving_rounds_up_and_ends_at_one_sample():
    sizes = [7]
    while sizes[-1] > 1:
        sizes.append(halve(sizes[-1]))
    assert sizes == [7, 4, 2, 1]


Pair = namedtuple("Pair", "inputs targets")


def test_slicing_keeps_the_structure_and_shares_what_is_not_per_sample():
    batch = {
        "skipped": 2,
        "image": torch.arange(12).reshape(6, 2),
        "polygons": [[i] for i in range(6)],
        "name": tuple(f"img_{i}" for i in range(6)),
        "scale": torch.tensor([0.5, 2.0]),
        "pair": Pair(torch.zeros(6, 3), torch.ones(6)),
        "parts": [torch.zeros(6), torch.ones(6)],  # a structure, not six samples
    }
    assert batch_size_of(batch) == 6
    part = slice_batch(batch, 2, 5, 6)
    assert part["skipped"] == 2
    assert part["image"].tolist() == [[4, 5], [6, 7], [8, 9]]
    assert part["polygons"] == [[2], [3], [4]]
    assert part["name"] == ("img_2", "img_3", "img_4")
    assert torch.equal(part["scale"], batch["scale"])
    assert isinstance(part["pair"], Pair) and part["pair"].inputs.shape == (3, 3)
    assert [t.shape[0] for t in part["parts"]] == [3, 3]


def test_a_batch_without_tensors_has_no_size_and_bad_ranges_are_refused():
    assert batch_size_of({"skipped": 4}) is None
    with pytest.raises(ValueError, match=r"\[4, 7\)"):
        slice_batch(torch.zeros(6), 4, 7, 6)


class _Recorder:
    def __init__(self) -> None:
        self.calls = []

    def __call__(self, name, value, **options):
        self.calls.append((name, float(value), options))


def test_logs_of_micro_batches_merge_into_the_whole_batch_values():
    buffer = LogBuffer()
    for size, loss, peak in ((3, 1.0, 5.0), (1, 5.0, 9.0)):
        buffer.start(size)
        buffer.record("train/loss", torch.tensor(loss), (), {"batch_size": size})
        buffer.record("val/peak", peak, (), {"reduce_fx": "max"})
        buffer.record("count", 1.0, (False,), {"reduce_fx": "sum"})  # prog_bar by position
        buffer.commit()
    buffer.start(4)
    buffer.record("train/loss", torch.tensor(100.0), (), {"batch_size": 4})
    buffer.drop()  # this micro-batch ran out of memory: its log is forgotten
    sink = _Recorder()
    buffer.replay(sink)
    assert sink.calls == [
        ("train/loss", 2.0, {"batch_size": 4}),  # (3 x 1 + 1 x 5) / 4
        ("val/peak", 9.0, {"reduce_fx": "max"}),
        ("count", 2.0, {"prog_bar": False, "reduce_fx": "sum"}),
    ]


def test_a_name_logged_once_is_replayed_with_the_arguments_it_was_given():
    buffer = LogBuffer()
    buffer.start(8)
    buffer.record("train/loss", torch.tensor(1.5), (True,), {"batch_size": 8})
    buffer.commit()
    calls = []
    buffer.replay(lambda *args, **kwargs: calls.append((args, kwargs)))
    assert calls == [(("train/loss", torch.tensor(1.5), True), {"batch_size": 8})]


def test_a_step_of_one_micro_batch_replays_its_calls_as_made():
    buffer = LogBuffer()
    buffer.start(8)
    buffer.record("train/loss", torch.tensor(1.0), (), {"batch_size": 8})
    buffer.record("train/loss", torch.tensor(3.0), (), {"batch_size": 8})  # twice, as made
    buffer.commit()
    calls = []
    buffer.replay(lambda *args, **kwargs: calls.append((args, kwargs)))
    assert [float(args[1]) for args, _ in calls] == [1.0, 3.0]
