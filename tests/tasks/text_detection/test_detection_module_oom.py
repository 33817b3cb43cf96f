"""DBNet's module survives injected OOMs: the same gradients where a split can give them, and
the same ICDAR metrics always.

DBNet's training step is coupled across its batch: BatchNorm normalises with the batch's
statistics, and the loss pools its terms over the batch (hard negatives, Dice, masked L1), so a
split step is in general only close to the whole one. A batch made of the same two samples
twice is the exception: each half has the whole batch's statistics and loss, so the recovery's
weighting and accumulation must reproduce the whole step's gradients up to float order.
"""

from __future__ import annotations

import numpy as np
import torch

from vramkit.tasks.text_detection.module import TextDetectionModule
from vramkit.tasks.text_detection.network.dbnet import DBNet
from vramkit.tasks.text_detection.network.loss import DBLoss

SIDE = 64
# DBLoss works in float32. Its sums over 64x64 maps, taken over the doubled batch or over
# each half, differ by a few ulps (1.2e-7), and the binarisation's k=50 and BatchNorm's backward
# pass (which subtracts means) amplify that: the doubled batch's gradients and the pair's
# differ by up to 8e-6 of the largest entry even without any split. 1e-4 is 12x that, and
# 5000x below what a wrong weight or a sample counted twice gives (0.5 of the gradient).
RTOL = 1e-4


def _module(prob_prior: float = 0.01) -> TextDetectionModule:
    torch.manual_seed(0)
    return TextDetectionModule(
        DBNet(backbone_width=0.25, inner_channels=16, prob_prior=prob_prior),
        DBLoss(),
        optimizer=lambda params: torch.optim.SGD(params, lr=0.01),
    )


def _training_pair(seed: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    shrink = torch.zeros(2, SIDE, SIDE)
    shrink[0, 10:20, 8:50] = 1.0
    shrink[1, 30:44, 20:60] = 1.0
    return {
        "image": torch.randn(2, 3, SIDE, SIDE, generator=generator),
        "shrink_map": shrink,
        "shrink_mask": torch.ones(2, SIDE, SIDE),
        "thresh_map": 0.3 + 0.4 * torch.rand(2, SIDE, SIDE, generator=generator),
        "thresh_mask": (torch.rand(2, SIDE, SIDE, generator=generator) > 0.5).float(),
    }


def test_a_split_training_step_of_a_doubled_batch_has_the_whole_batch_gradients(oom_rehearsal):
    pair = _training_pair(0)
    batch = {key: torch.cat([value, value]) for key, value in pair.items()}
    reference, _ = oom_rehearsal.step_gradients(_module, batch)
    recovered, module = oom_rehearsal.step_gradients(_module, batch, train_above=2)
    assert module.oom_state.train_micro_batch == 2
    oom_rehearsal.assert_same_gradients(recovered, reference, rtol=RTOL)


def _validation_batch(seed: int, samples: int) -> dict:
    generator = torch.Generator().manual_seed(seed)
    large = np.array([[2, 2], [61, 2], [61, 61], [2, 61]], dtype=np.float32)
    small = np.array([[5, 5], [12, 5], [12, 9], [5, 9]], dtype=np.float32)
    return {
        "image": torch.randn(samples, 3, SIDE, SIDE, generator=generator),
        "polygons": [[large, small]] * samples,
        "ignore": [[False, index % 2 == 1] for index in range(samples)],
        "original_size": torch.tensor([[SIDE, SIDE]] * samples),
    }


def test_split_validation_gives_the_same_icdar_metrics(oom_rehearsal):
    # A probability prior of 0.99 makes the untrained net detect one box per image, which
    # matches the large ground-truth polygon: metrics strictly between 0 and 1.
    def module() -> TextDetectionModule:
        return _module(prob_prior=0.99)

    batches = [_validation_batch(1, 4), _validation_batch(2, 3)]
    reference, _ = oom_rehearsal.validation_metrics(module, batches)
    recovered, split = oom_rehearsal.validation_metrics(module, batches, val_above=1)
    assert split.oom_state.val_micro_batch == 1
    assert 0 < reference["val/recall"] < 1 and reference["val/precision"] > 0
    for name in ("val/precision", "val/recall", "val/hmean"):
        assert recovered[name] == reference[name]  # ratios of the same integer counts
