"""A trace rebuilt from the model cut to 2, 3 and 4 of its blocks equals the whole model's trace,
byte for byte; where the short traces do not repeat, the whole model is traced."""

from __future__ import annotations

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from vramkit.core.planner.cuda.cuda_rules import DeviceRules
from vramkit.core.planner.decisions.plan import INFERENCE, TRAIN, VAL, MemoryPlanner
from vramkit.core.planner.tracing.batches import PhaseSamples
from vramkit.core.planner.tracing.block_extrapolation import (
    Tokens,
    expand,
    insertions,
    log_tokens,
    replay,
)
from vramkit.core.planner.tracing.fake_trace import step_result
from vramkit.core.planner.tracing.repeated_blocks import repeated_blocks
from vramkit.core.planner.tracing.run_setup import RunSetup

T4 = DeviceRules(capability=(7, 5), flash_attention=False, mem_efficient_attention=True)
WIDTH = 32


def test_chunks_a_token_apart_are_found_and_repeated():
    block, other = [1, 2], [3, 4]

    def log(copies):
        return [0, *block * copies, 9, *other * copies, 8]

    chunks = insertions(log(2), log(3), log(4))
    assert chunks is not None
    assert expand(log(2), chunks, 6) == log(8)


def test_the_third_log_tells_which_split_repeats():
    # A list of allocations (1) and the list of their frees (2): with 2 and 3 entries, one
    # chunk [1, 2] between them makes the longer log too, but inserted twice it gives
    # 1 1 1 2 1 2 2 2, not 1 1 1 1 2 2 2 2.
    def log(copies):
        return [0, *[1] * copies, *[2] * copies, 9]

    chunks = insertions(log(2), log(3), log(4))
    assert expand(log(2), chunks, 5) == log(7)


def test_a_chunk_that_does_not_repeat_is_refused():
    assert insertions([1, 2, 3], [1, 4, 2, 3], [1, 4, 2, 5, 3]) is None
    assert insertions([1, 2, 3], [1, 4, 2, 3], [1, 4, 4, 2, 3, 3]) is None


def test_a_log_that_is_not_the_shorter_one_with_chunks_inserted_is_refused():
    assert insertions([1, 2, 3], [1, 4, 2], [1, 4, 4, 2]) is None
    assert insertions([1, 2, 3], [1, 2], [1]) is None
    assert insertions([1, 2, 3], [1, 2, 3], [1, 2, 3]) is None


class BlockStack(L.LightningModule):
    """Identical residual blocks in an `nn.ModuleList`; with `alternate`, every other block's
    output goes through one more op, which its parameters do not show."""

    def __init__(self, blocks: int = 6, alternate: bool = False) -> None:
        super().__init__()
        self.embed = nn.Linear(WIDTH, WIDTH)
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Linear(WIDTH, 2 * WIDTH), nn.GELU(), nn.Linear(2 * WIDTH, WIDTH))
            for _ in range(blocks)
        )
        self.head = nn.Linear(WIDTH, 4)
        self.alternate = alternate

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x)
        for index, block in enumerate(self.blocks):
            x = x + block(x)
            if self.alternate and index % 2:
                x = torch.tanh(x)
        return self.head(x)

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        return F.cross_entropy(self(batch["x"]).flatten(0, 1), batch["y"].flatten())

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        self(batch["x"])

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters())


def _stack_planner(**model) -> MemoryPlanner:
    sample = {"x": torch.randn(1, 16, WIDTH), "y": torch.zeros(1, 16, dtype=torch.long)}
    return MemoryPlanner(lambda _overrides: BlockStack(**model), PhaseSamples(sample, sample, 8, 8))


def _full_and_rebuilt(make, phases, batch_sizes, setup):
    rebuilt, full = make(), make()
    full.extrapolate_blocks = False
    pairs = []
    for phase in phases:
        for size in batch_sizes:
            pairs.append((rebuilt.measure(phase, size, setup), full.measure(phase, size, setup)))
    return rebuilt, pairs


@pytest.mark.parametrize("precision", ["32-true", "16-mixed"])
def test_identical_blocks_are_rebuilt_equal_to_the_full_trace(precision):
    setup = RunSetup(precision=precision, device=T4)
    planner, pairs = _full_and_rebuilt(_stack_planner, (TRAIN, VAL, INFERENCE), (1, 3), setup)
    assert planner.rebuilt_traces == planner.traces == len(pairs)
    for rebuilt, full in pairs:
        assert rebuilt == full


def test_blocks_that_differ_by_position_are_traced_whole():
    setup = RunSetup(precision="32-true", device=T4)
    make = lambda: _stack_planner(alternate=True)  # noqa: E731
    planner, pairs = _full_and_rebuilt(make, (TRAIN, INFERENCE), (2,), setup)
    assert repeated_blocks(planner._subject(setup).module) is not None  # same structure
    assert planner.rebuilt_traces == 0
    for rebuilt, full in pairs:
        assert rebuilt == full


def test_the_replayed_log_gives_the_recorders_own_trace():
    planner = _stack_planner()
    setup = RunSetup(precision="16-mixed", device=T4)
    subject = planner._subject(setup)
    trace, _, recorder = planner._traced(TRAIN, 2, setup, subject)
    tokens = Tokens()
    again = step_result(replay(log_tokens(recorder, tokens), tokens))
    assert again.peak_bytes == trace.peak_bytes > 0
    assert again.breakdown == trace.breakdown
    assert again.peak_at == trace.peak_at
    assert again.holders == trace.holders
    assert _renamed(again.events) == _renamed(trace.events)
    assert len(trace.events) > 100


def _renamed(events):
    names: dict[int, int] = {}
    return [(names.setdefault(serial, len(names)), size) for serial, size in events]
