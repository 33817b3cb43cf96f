"""DBNet's training loss: balanced BCE + Dice + masked L1, safe under mixed precision.

Everything is computed in float32 from logits: plain ``binary_cross_entropy`` on probabilities
refuses to run under CUDA autocast and loses precision in float16.

Every term divides sums over the batch (and the hard negatives are ranked over the batch), so
under data-parallel training each process computing it on its own share would optimise another
objective than one process with the global batch (the mean of ratios is not the ratio of sums).
With ``pooled=True`` the sums and the ranking span every process
(:mod:`vramkit.core.distributed.process_sums`): P processes then step as one process with the
global batch does. With one process that changes nothing.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vramkit.core.distributed.process_sums import (
    process_count,
    share_of_largest,
    sum_of_largest_over_processes,
    sum_over_processes,
)

TARGET_KEYS = ("shrink_map", "shrink_mask", "thresh_map", "thresh_mask")
OUTPUT_KEYS = ("prob_logits", "thresh", "binary_logits")


def sum_of_largest(values: Tensor, count: Tensor, *, sync_free: bool) -> Tensor:
    """Sum of the ``count`` largest entries of the 1-D ``values`` (``count`` a 0-d tensor).

    ``sync_free=True`` keeps ``count`` on the device (the ``count``-th value of a full sort), so
    an accelerator never waits for the host; on a GPU the sort is cheap. ``sync_free=False``
    reads ``count`` and uses ``topk``, which on a CPU (where reading it costs nothing) is 2-10x
    faster than sorting a whole batch of pixels. Both give the same value; values tied at the
    boundary share its places (:func:`~vramkit.core.distributed.process_sums.share_of_largest`),
    as they do when several processes rank their pixels together.
    """
    if values.numel() == 0:
        return values.sum()
    if sync_free:
        ranked, _ = torch.sort(values.detach(), descending=True)
        threshold = ranked[(count.long() - 1).clamp(0, ranked.numel() - 1)]
    else:
        count = min(int(count), values.numel())
        threshold = torch.topk(values.detach(), max(count, 1)).values[-1]
    return share_of_largest(values, count, threshold, across=False)


def balanced_bce_with_logits(
    logits: Tensor,
    target: Tensor,
    mask: Tensor,
    negative_ratio: float = 3.0,
    fallback_negatives: int = 100,
    eps: float = 1e-6,
    pooled: bool = False,
) -> Tensor:
    """BCE over all positive pixels and the hardest negatives, pooled over the batch (over the
    global batch of every process with ``pooled``).

    Keeps the ``min(#negatives, negative_ratio * #positives)`` negative pixels with the largest
    loss; a batch without positive pixels keeps its ``fallback_negatives`` hardest negatives, so
    text-free crops still teach the background. Never divides by zero.
    """
    pixel_loss = F.binary_cross_entropy_with_logits(logits, target, reduction="none")
    positive = target * mask
    negative = (1.0 - target) * mask
    across = pooled and process_count() > 1
    total = sum_over_processes if across else _same
    positive_count = total(positive.sum())
    wanted = torch.where(
        positive_count > 0,
        torch.floor(positive_count * negative_ratio),
        torch.full_like(positive_count, float(fallback_negatives)),
    )
    negative_count = torch.minimum(wanted, total(negative.sum()))

    negative_losses = (pixel_loss * negative).flatten()
    if across:  # the global count is read anyway to rank across processes
        hardest_negative_sum = total(
            sum_of_largest_over_processes(negative_losses, int(negative_count))
        )
    else:
        hardest_negative_sum = sum_of_largest(
            negative_losses, negative_count, sync_free=logits.device.type != "cpu"
        )
    positive_sum = total((pixel_loss * positive).sum())
    return (positive_sum + hardest_negative_sum) / (positive_count + negative_count + eps)


def _same(tensor: Tensor) -> Tensor:
    return tensor


def dice_loss(
    prob: Tensor, target: Tensor, mask: Tensor, eps: float = 1e-6, pooled: bool = False
) -> Tensor:
    """``1 - 2|P∩G| / (|P| + |G|)`` over the masked pixels of the whole batch (of every process
    with ``pooled``); in [0, 1]."""
    total = sum_over_processes if pooled else _same
    sums = total(
        torch.stack([(prob * target * mask).sum(), (prob * mask).sum() + (target * mask).sum()])
    )
    return 1.0 - 2.0 * sums[0] / (sums[1] + eps)


def masked_l1(
    pred: Tensor, target: Tensor, mask: Tensor, eps: float = 1e-6, pooled: bool = False
) -> Tensor:
    """Mean absolute error over the pixels where ``mask`` is set (on every process with
    ``pooled``); 0 when none is."""
    total = sum_over_processes if pooled else _same
    sums = total(torch.stack([((pred - target).abs() * mask).sum(), mask.sum()]))
    return sums[0] / (sums[1] + eps)


class DBLoss(nn.Module):
    """``prob_weight * BCE(prob) + binary_weight * Dice(binary) + thresh_weight * L1(thresh)``.

    The defaults (5, 1, 10, hard negatives 3:1) are those of the DBNet authors' code.
    ``pool_over_processes``: under data-parallel training, pool every term over the global
    batch of all processes (see the module's docstring); false: each process pools its own.
    """

    def __init__(
        self,
        prob_weight: float = 5.0,
        binary_weight: float = 1.0,
        thresh_weight: float = 10.0,
        negative_ratio: float = 3.0,
        eps: float = 1e-6,
        fallback_negatives: int = 100,
        pool_over_processes: bool = True,
    ) -> None:
        super().__init__()
        if negative_ratio <= 0:
            raise ValueError(f"negative_ratio must be > 0, got {negative_ratio}")
        if fallback_negatives < 1:
            raise ValueError(f"fallback_negatives must be >= 1, got {fallback_negatives}")
        self.prob_weight = prob_weight
        self.binary_weight = binary_weight
        self.thresh_weight = thresh_weight
        self.negative_ratio = negative_ratio
        self.eps = eps
        self.fallback_negatives = fallback_negatives
        self.pool_over_processes = pool_over_processes

    def forward(self, outputs: dict[str, Tensor], batch: dict[str, Tensor]) -> dict[str, Tensor]:
        """Compute the loss from DBNet outputs and target maps, all (B, H, W).

        Returns ``loss`` (the weighted total) and the unweighted terms ``loss_prob``,
        ``loss_binary`` and ``loss_thresh``, all float32 scalars.
        """
        for key in OUTPUT_KEYS:
            if key not in outputs:
                raise KeyError(
                    f"DBLoss needs model output {key!r} (got {sorted(outputs)}); run DBNet in "
                    "training mode or with training_maps=True"
                )
        shape = outputs["prob_logits"].shape
        for key in TARGET_KEYS:
            if key not in batch:
                raise KeyError(f"DBLoss needs batch entry {key!r} (got {sorted(batch)})")
            if batch[key].shape != shape:
                raise ValueError(
                    f"batch[{key!r}] has shape {tuple(batch[key].shape)}, "
                    f"but the model outputs {tuple(shape)}"
                )

        prob_logits = outputs["prob_logits"].float()
        thresh = outputs["thresh"].float()
        binary_logits = outputs["binary_logits"].float()
        shrink_map = batch["shrink_map"].float()
        shrink_mask = batch["shrink_mask"].float()
        thresh_map = batch["thresh_map"].float()
        thresh_mask = batch["thresh_mask"].float()

        loss_prob = balanced_bce_with_logits(
            prob_logits,
            shrink_map,
            shrink_mask,
            self.negative_ratio,
            self.fallback_negatives,
            self.eps,
            pooled=self.pool_over_processes,
        )
        pooled = self.pool_over_processes
        loss_binary = dice_loss(
            torch.sigmoid(binary_logits), shrink_map, shrink_mask, self.eps, pooled=pooled
        )
        loss_thresh = masked_l1(thresh, thresh_map, thresh_mask, self.eps, pooled=pooled)
        total = (
            self.prob_weight * loss_prob
            + self.binary_weight * loss_binary
            + self.thresh_weight * loss_thresh
        )
        return {
            "loss": total,
            "loss_prob": loss_prob,
            "loss_binary": loss_binary,
            "loss_thresh": loss_thresh,
        }
