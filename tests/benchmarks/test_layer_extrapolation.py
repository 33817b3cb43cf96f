"""The layer-extrapolation check: which block lists it cuts, and how it judges a carried plan."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from benchmarks import layer_extrapolation as check
from vramkit.core.planner.tracing.recorder import CATEGORIES

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "core" / "planner"))


class _Block(nn.Module):
    def __init__(self, width: int, index: int) -> None:
        super().__init__()
        self.layer_idx = index  # Hugging Face's own index: not a difference
        self.groups = 1  # equals block 1's index, and is the same in every block
        self.linear = nn.Linear(width, width)


class _Stack(nn.Module):
    def __init__(self, widths: list[int]) -> None:
        super().__init__()
        self.head = nn.ModuleList([nn.Linear(4, 4) for _ in range(4)])  # fewer parameters
        self.layers = nn.ModuleList([_Block(w, i) for i, w in enumerate(widths)])


def test_the_largest_list_of_identical_blocks_is_found():
    with torch.device("meta"):
        model = _Stack([16] * 6)
    assert check.repeated_blocks(model) is model.layers


def test_blocks_that_differ_are_not_cut():
    with torch.device("meta"):
        wider = _Stack([16] * 5 + [32])
        configured = _Stack([16] * 6)
    configured.layers[3].linear.some_setting = 2.0  # same shapes, another setting
    assert check.repeated_blocks(wider) is wider.head
    assert check.repeated_blocks(configured) is configured.head
    with torch.device("meta"):
        too_few = nn.Sequential(nn.ModuleList([_Block(8, i) for i in range(3)]))
    assert check.repeated_blocks(too_few) is None


def test_a_hugging_face_phi_decoder_list_is_found_and_cut_back():
    pytest.importorskip("transformers")
    from planning_models import TINY_PHI, PhiClassifier

    with torch.device("meta"):
        module = PhiClassifier({**TINY_PHI, "num_hidden_layers": 6}, None)
    blocks = check.repeated_blocks(module)
    assert blocks is module.model.model.layers
    with check.cut_to(blocks, 2):
        assert len(module.model.model.layers) == 2
    assert len(blocks) == 6


def _figures(per_block: int, replayed: int, label: str = "step 1: backward") -> check._Figures:
    numbers = dict.fromkeys((f"allocated.{c}" for c in CATEGORIES), 0)
    numbers |= {
        "allocated.parameters": 100 + per_block,
        "replayed_reserve": replayed,
        "overhead": 0,
        "allocated_with_workspaces": 100 + per_block,
        "peak": 100 + per_block,
    }
    return check._Figures(numbers, label, {("layers.*", "parameters"): per_block})


def test_a_straight_line_is_carried_and_judged_against_the_full_trace():
    short = [_figures(10 * n, 1000 * n) for n in check.SHORT_COUNTS]
    exact = check.compare(short, _figures(240, 24_000), target=24)
    assert exact["affine"] and exact["exact"]
    wrong = check.compare(short, _figures(240, 24_000 + 512), target=24)
    assert wrong["affine"] and not wrong["exact"]
    assert wrong["figures"]["replayed_reserve"]["error"] == -512


def test_a_bent_figure_or_a_moving_peak_is_not_affine():
    bent = [_figures(10 * n, 1000 * n + (n == 3) * 2048) for n in check.SHORT_COUNTS]
    assert not check.compare(bent, _figures(240, 24_000), target=24)["affine"]
    moving = [_figures(10 * n, 1000 * n, f"phase {n}") for n in check.SHORT_COUNTS]
    assert not check.compare(moving, _figures(240, 24_000), target=24)["affine"]


@pytest.mark.parametrize("replayed", [3 << 30, 1 << 30])  # above, then below the reserve floor
def test_the_carried_overhead_is_the_planners_own(replayed):
    from vramkit.core.planner.cuda.allocator_model import replay_reserved
    from vramkit.core.planner.cuda.cuda_rules import DeviceRules

    t4 = DeviceRules(capability=(7, 5), flash_attention=False, mem_efficient_attention=True)
    allocated = 2 << 30
    events = [(0, replayed)]
    workspaces = [(-1 - i, size) for i, size in enumerate(t4.workspace_sizes(backward=True))]
    numbers = dict.fromkeys((f"allocated.{c}" for c in CATEGORIES), 0)
    numbers |= {  # what the check records: the planner's own replay, workspaces first
        "allocated.activations": allocated,
        "replayed_reserve": replay_reserved([*workspaces, *events]),
    }
    planner_overhead = t4.overhead_bytes(allocated, events, backward=True)
    derived = check.derive(numbers, t4, backward=True)
    assert derived["overhead"] == planner_overhead
    assert derived["peak"] == allocated + planner_overhead


def _events(blocks: int) -> list[tuple[int, int]]:
    """A forward that saves 8 bytes per block and frees a 4-byte temporary, then a backward
    that gives the saved tensors back in reverse."""
    events, serial = [(0, 100)], 1
    saved = []
    for _ in range(blocks):
        events += [(serial, 8), (serial + 1, 4), (serial + 1, 0)]
        saved.append(serial)
        serial += 2
    events += [(serial, 50)]
    events += [(s, 0) for s in reversed(saved)]
    return events


def test_an_allocation_sequence_carried_by_its_inserted_chunks():
    short = [_events(n) for n in check.SHORT_COUNTS]
    found = check.sequence_check(short, _events(24), target=24)
    assert found["inserts_only"] and found["same_chunks_again"]
    assert found["sizes_carried_exactly"]
    assert not check.sequence_check(short, _events(23), target=24)["sizes_carried_exactly"]
