"""DBLoss: hard-negative mining, edge cases, gradients and mixed precision."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from vramkit.tasks.text_detection.network.dbnet import DBNet
from vramkit.tasks.text_detection.network.loss import (
    DBLoss,
    balanced_bce_with_logits,
    sum_of_largest,
)


def _targets(batch: int = 2, size: int = 32, with_text: bool = True) -> dict[str, torch.Tensor]:
    shrink = torch.zeros(batch, size, size)
    thresh_map = torch.full((batch, size, size), 0.3)
    thresh_mask = torch.zeros(batch, size, size)
    if with_text:
        shrink[:, 10:20, 6:26] = 1.0
        thresh_mask[:, 7:23, 3:29] = 1.0
        thresh_map[:, 7:23, 3:29] = 0.6
    return {
        "shrink_map": shrink,
        "shrink_mask": torch.ones(batch, size, size),
        "thresh_map": thresh_map,
        "thresh_mask": thresh_mask,
    }


def _outputs_from(prob: torch.Tensor, thresh: torch.Tensor, k: float = 50.0) -> dict:
    prob = prob.clamp(1e-4, 1 - 1e-4)
    prob_logits = torch.log(prob / (1 - prob))
    return {
        "prob_logits": prob_logits,
        "thresh": thresh,
        "binary_logits": k * (prob - thresh),
    }


def test_hard_negative_mining_keeps_three_negatives_per_positive() -> None:
    logits = torch.tensor([[0.5, 4.0, 3.0, 2.0, 1.0, -1.0, -2.0, -3.0]])
    target = torch.tensor([[1.0, 0, 0, 0, 0, 0, 0, 0]])
    mask = torch.ones_like(target)
    pixel = F.binary_cross_entropy_with_logits(logits, target, reduction="none")
    expected = (pixel[0, 0] + pixel[0, 1:4].sum()) / 4  # the 3 hardest negatives: logits 4, 3, 2
    got = balanced_bce_with_logits(logits, target, mask, negative_ratio=3.0)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("count", [0.0, 1.0, 37.0, 999.0, 1000.0])
def test_sort_and_topk_selections_agree(count: float) -> None:
    values = torch.rand(1000, generator=torch.Generator().manual_seed(0))
    expected = torch.sort(values, descending=True).values[: int(count)].sum()
    for sync_free in (True, False):
        got = sum_of_largest(values, torch.tensor(count), sync_free=sync_free)
        torch.testing.assert_close(got, expected, msg=f"sync_free={sync_free}")


def test_masked_pixels_are_ignored_by_the_mining() -> None:
    logits = torch.tensor([[0.5, 9.0, 1.0, 0.0]])
    target = torch.tensor([[1.0, 0, 0, 0]])
    mask = torch.tensor([[1.0, 0, 1, 1]])  # the hardest negative lies outside the mask
    pixel = F.binary_cross_entropy_with_logits(logits, target, reduction="none")
    expected = (pixel[0, 0] + pixel[0, 2] + pixel[0, 3]) / 3
    got = balanced_bce_with_logits(logits, target, mask, negative_ratio=3.0)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


def test_zero_positive_batch_still_penalises_false_text() -> None:
    batch = _targets(with_text=False)
    shape = batch["shrink_map"].shape
    everything_text = _outputs_from(torch.full(shape, 0.99), torch.full(shape, 0.3))
    all_background = _outputs_from(torch.full(shape, 0.01), torch.full(shape, 0.3))

    bad = DBLoss()(everything_text, batch)
    good = DBLoss()(all_background, batch)
    for value in (*bad.values(), *good.values()):
        assert torch.isfinite(value)
    # With no positives the fallback negatives are kept: the false text costs BCE of logit 4.6.
    assert float(bad["loss_prob"]) > 4.0
    assert float(good["loss_prob"]) < 0.05


def test_empty_masks_give_finite_zero_terms() -> None:
    batch = {key: torch.zeros(1, 32, 32) for key in _targets()}
    outputs = _outputs_from(torch.full((1, 32, 32), 0.7), torch.full((1, 32, 32), 0.5))
    losses = DBLoss()(outputs, batch)
    assert all(torch.isfinite(v) for v in losses.values())
    assert float(losses["loss_prob"]) == 0.0
    assert float(losses["loss_thresh"]) == 0.0


def test_perfect_prediction_beats_inverted_prediction() -> None:
    batch = _targets()
    shrink = batch["shrink_map"]
    perfect = _outputs_from(shrink * 0.9999 + 0.0001 * (1 - shrink), batch["thresh_map"])
    inverted = _outputs_from(1 - shrink, 1 - batch["thresh_map"])
    loss = DBLoss()
    good, bad = loss(perfect, batch), loss(inverted, batch)
    for key in ("loss", "loss_prob", "loss_binary", "loss_thresh"):
        assert float(good[key]) < float(bad[key]), key
    assert float(good["loss"]) < 0.1
    assert float(good["loss_thresh"]) == pytest.approx(0.0, abs=1e-6)


def test_total_is_the_weighted_sum() -> None:
    torch.manual_seed(0)
    batch = _targets()
    shape = batch["shrink_map"].shape
    outputs = _outputs_from(torch.rand(shape), torch.rand(shape))
    losses = DBLoss(prob_weight=2.0, binary_weight=3.0, thresh_weight=4.0)(outputs, batch)
    expected = 2 * losses["loss_prob"] + 3 * losses["loss_binary"] + 4 * losses["loss_thresh"]
    torch.testing.assert_close(losses["loss"], expected)


def test_gradient_reaches_all_three_outputs() -> None:
    torch.manual_seed(0)
    batch = _targets()
    shape = batch["shrink_map"].shape
    outputs = {
        "prob_logits": torch.randn(shape, requires_grad=True),
        "thresh": torch.rand(shape).requires_grad_(),
        "binary_logits": torch.randn(shape, requires_grad=True),
    }
    DBLoss()(outputs, batch)["loss"].backward()
    for key, tensor in outputs.items():
        assert tensor.grad is not None, key
        assert float(tensor.grad.abs().sum()) > 0, key


def test_finite_float32_under_cpu_bfloat16_autocast() -> None:
    torch.manual_seed(0)
    model = DBNet(backbone_width=0.25, inner_channels=64)
    batch = _targets(size=64)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        outputs = model(torch.randn(2, 3, 64, 64))
        losses = DBLoss()(outputs, batch)
    assert outputs["prob_logits"].dtype == torch.bfloat16  # autocast really was on
    for key, value in losses.items():
        assert value.dtype == torch.float32, key
        assert torch.isfinite(value), key
    losses["loss"].backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)


def test_missing_output_or_target_is_named() -> None:
    batch = _targets()
    outputs = _outputs_from(torch.rand(2, 32, 32), torch.rand(2, 32, 32))
    eval_outputs = {"prob_logits": outputs["prob_logits"], "prob": outputs["prob_logits"]}
    with pytest.raises(KeyError, match="thresh"):
        DBLoss()(eval_outputs, batch)
    without_mask = {k: v for k, v in batch.items() if k != "thresh_mask"}
    with pytest.raises(KeyError, match="thresh_mask"):
        DBLoss()(outputs, without_mask)
    batch["shrink_map"] = batch["shrink_map"][:, :16]
    with pytest.raises(ValueError, match=r"shrink_map.*\(2, 16, 32\)"):
        DBLoss()(outputs, batch)
