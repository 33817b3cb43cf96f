"""ARC teacher and SAGE student survive injected OOMs with the whole batch's gradients and scores.

Their loss adds means over different units: cells of the answers (``cell_ce``), examples
(``size_ce``) and, for the student, input tokens (feature MSE and cosine). The batch below has
answers of 1 to 48 cells and sequences of different lengths, so a split weighted by samples
alone would be visibly wrong; weighted per unit, it matches the whole batch up to float order.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

from vramkit.tasks.sage.data.arc_batching import FEATURES_KEY, collate_grid_items
from vramkit.tasks.sage.data.arc_examples import ArcExample, EncodingSettings, example_item
from vramkit.tasks.sage.distill_module import TEACHER, SageDistillModule
from vramkit.tasks.sage.grid_module import ArcTeacherModule
from vramkit.tasks.sage.grid_transformer import GridTransformer
from vramkit.tasks.sage.grids.grid_metrics import SCORE_NAMES

TEACHER_WIDTH = 8
# Answer shapes (height, width) of the 4 examples: 48, 1, 6 and 20 cells.
ANSWERS = ((6, 8), (1, 1), (2, 3), (4, 5))
# Gradients are float32 sums over ~10^3-10^4 products; taking them in two halves changes the
# order of those sums, which moves a result by a few ulps (1.2e-7 each) of its largest terms.
# 1e-5 of the largest gradient entry is 60x what was measured (0.8-1.6e-7), and far below what
# weighting by samples gives (0.14-1.6; checked below to exceed 1e-2).
RTOL = 1e-5


def _batch(seed: int = 0, *, features: bool = False) -> dict[str, torch.Tensor]:
    rng = np.random.default_rng(seed)

    def grid(h: int, w: int) -> np.ndarray:
        return rng.integers(0, 10, (h, w)).astype(np.uint8)

    items = []
    for index, answer in enumerate(ANSWERS):
        demos = tuple((grid(3, 4), grid(4, 3)) for _ in range(index % 3))
        example = ArcExample(f"t{index}/test0", f"t{index}", demos, grid(*answer), grid(*answer))
        item = example_item(example, EncodingSettings())
        if features:
            length = item["tokens"].shape[0]
            item[FEATURES_KEY] = torch.from_numpy(rng.normal(size=(length, TEACHER_WIDTH))).half()
            item["teacher_cells"] = torch.from_numpy(rng.integers(0, 10, (30, 30))).long()
            item["teacher_size"] = torch.tensor(answer)
        items.append(item)
    return collate_grid_items(items)


def _net() -> GridTransformer:
    torch.manual_seed(0)
    # no dropout: a split consumes the random stream differently
    return GridTransformer(d_model=16, num_layers=1, num_heads=2, ffn_dim=32, dropout=0.0)


def _optimizer(params):
    return torch.optim.SGD(params, lr=0.1)


def _teacher(cls: type[ArcTeacherModule] = ArcTeacherModule) -> ArcTeacherModule:
    return cls(_net(), _optimizer, size_weight=0.5)


class _Student(SageDistillModule):
    def on_fit_end(self) -> None:
        """No compression report: these runs have no feature-cache datamodule."""


def _student(cls: type[SageDistillModule] = _Student) -> SageDistillModule:
    loss = {"task": 1.0, "feature": 0.5, "size": 0.5, "mse": 1.0, "cosine": 2.0}
    return cls(_net(), _optimizer, loss=loss, teacher_width=TEACHER_WIDTH)


class _SampleWeightedTeacher(ArcTeacherModule):
    """What a split weighted by samples alone would do."""

    def micro_batch_weight(self, batch: dict[str, torch.Tensor]) -> float:
        return float(batch["target"].shape[0])


class _SampleWeightedStudent(_Student):
    def micro_batch_weight(self, batch: dict[str, torch.Tensor]) -> float:
        return float(batch["target"].shape[0])


CASES = {
    "arc_teacher": (_teacher, functools.partial(_teacher, _SampleWeightedTeacher), False),
    "sage_distill": (_student, functools.partial(_student, _SampleWeightedStudent), True),
}


@pytest.mark.parametrize("task", CASES)
@pytest.mark.parametrize("train_above", [2, 1])
def test_a_split_training_step_has_the_whole_batch_gradients(oom_rehearsal, task, train_above):
    make_module, make_sample_weighted, features = CASES[task]
    batch = _batch(features=features)
    reference, _ = oom_rehearsal.step_gradients(make_module, batch)
    recovered, module = oom_rehearsal.step_gradients(make_module, batch, train_above=train_above)
    # 4 -> 2 (-> 1: the last resort) samples per micro-batch
    assert module.oom_state.train_micro_batch == train_above
    assert module.oom_state.train_recoveries == (1 if train_above == 2 else 2)
    oom_rehearsal.assert_same_gradients(recovered, reference, rtol=RTOL)
    if task == "sage_distill":
        assert "projector.weight" in recovered  # the distillation term was split too
    naive, _ = oom_rehearsal.step_gradients(make_sample_weighted, batch, train_above=train_above)
    assert oom_rehearsal.largest_gradient_difference(naive, reference) > 1e3 * RTOL


@pytest.mark.parametrize("task", CASES)
def test_split_validation_gives_the_same_scores_and_losses(oom_rehearsal, task):
    make_module, _, features = CASES[task]
    batches = [_batch(seed, features=features) for seed in (1, 2)]
    reference, _ = oom_rehearsal.validation_metrics(make_module, batches)
    recovered, module = oom_rehearsal.validation_metrics(make_module, batches, val_above=1)
    assert module.oom_state.val_micro_batch == 1 and module.oom_state.val_recoveries == 2
    for prefix in ("", "copy_", *((TEACHER,) if features else ())):
        for name in SCORE_NAMES:
            # ratios of integer counts: exactly the same
            assert recovered[f"val/{prefix}{name}"] == reference[f"val/{prefix}{name}"]
    losses = [name for name in reference if not name.startswith("oom/")]
    losses = [name for name in losses if name.split("/")[1].endswith(("loss", "_ce", "mse", "ine"))]
    assert "val/loss" in losses and "val/cell_ce" in losses
    if features:
        assert {"val/feature_mse", "val/feature_cosine", "val/task_loss"} <= set(losses)
    for name in losses:
        # means re-formed from per-unit float64 sums: float order only
        assert recovered[name] == pytest.approx(reference[name], rel=1e-6), name
