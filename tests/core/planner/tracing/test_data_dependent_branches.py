"""A branch on a random draw (LayerDrop) stops the plan instead of being guessed."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

from vramkit.core.planner.errors import PlanningError
from vramkit.core.planner.tracing.fake_trace import FakeStepRecorder


class LayerDropStack(nn.Module):
    """Wav2Vec2's LayerDrop: each layer is skipped when a fresh draw falls under `layerdrop`."""

    def __init__(self, layerdrop: float) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(64, 64) for _ in range(4))
        self.layerdrop = layerdrop

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            if self.training and self.layerdrop > 0 and torch.rand([]) < self.layerdrop:
                continue
            x = layer(x)
        return x


def _run(build: Callable[[], nn.Module], *, read_loss: bool = False) -> FakeStepRecorder:
    with FakeTensorMode():
        model = build()
        recorder = FakeStepRecorder(scalar_stand_in=8, round_to_device=True, keep_timeline=False)
        with recorder:
            loss = model(torch.randn(8, 64)).mean()
            if read_loss:
                assert loss.item() == 8.0  # a value read from data, not a draw: the stand-in
        recorder.close()
    return recorder


def test_layerdrop_stops_the_plan_with_what_to_do():
    with pytest.raises(PlanningError, match=r"random draw.*layerdrop=0"):
        _run(lambda: LayerDropStack(layerdrop=0.1))


def test_without_layerdrop_every_layer_runs_and_values_read_from_data_are_stand_ins():
    _run(lambda: LayerDropStack(layerdrop=0.0), read_loss=True)


def test_dropout_masks_are_not_draws_the_step_branches_on():
    _run(
        lambda: nn.Sequential(nn.Linear(64, 64), nn.Dropout(0.5), nn.Linear(64, 1)), read_loss=True
    )


class AlwaysDrawingLayerDrop(nn.Module):
    """transformers 4.x OPT: draws in training even when `layerdrop` is 0, then compares."""

    def __init__(self, layerdrop: float) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(64, 64) for _ in range(4))
        self.layerdrop = layerdrop
        self.ran = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            if torch.rand([]) < self.layerdrop:
                continue
            self.ran += 1
            x = layer(x)
        return x


@pytest.mark.parametrize(("layerdrop", "layers_run"), [(0.0, 4), (1.0, 0)])
def test_a_draw_whose_range_settles_the_comparison_is_answered(layerdrop, layers_run):
    model_holder = {}

    def build() -> nn.Module:
        model_holder["model"] = AlwaysDrawingLayerDrop(layerdrop)
        return model_holder["model"]

    _run(build)
    assert model_holder["model"].ran == layers_run


def test_a_draw_compared_inside_its_range_still_stops_the_plan():
    with pytest.raises(PlanningError, match="random draw"):
        _run(lambda: AlwaysDrawingLayerDrop(layerdrop=0.5))
