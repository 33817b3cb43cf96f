"""Compare inference backends of one DBNet on validation batches: probability maps and ICDAR scores.

Every network (the PyTorch reference, its ONNX export, the int8 models) sees the same normalised
batch; each probability map goes through the same post-processing and ICDAR 2015 matching as
``TextDetectionModule`` validation, so an identical ``hmean`` means the backends agree on every
box that counts, and ``max_abs_prob_diff`` says how far apart the maps themselves are.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import torch
from torch import nn

from vramkit.tasks.text_detection.data.device_inputs import to_model_inputs
from vramkit.tasks.text_detection.evaluation.icdar_eval import ImageCounts, match_image, summarize
from vramkit.tasks.text_detection.network.postprocess import (
    PostprocessConfig,
    boxes_from_probability,
)

REFERENCE = "torch"
"""The name the reference network's scores are recorded under."""


def _image_counts(
    probability: np.ndarray, batch: Mapping[str, Any], postprocess: PostprocessConfig
) -> list[ImageCounts]:
    counts = []
    for prob_map, (height, width), polygons, ignore in zip(
        probability, batch["original_size"], batch["polygons"], batch["ignore"], strict=True
    ):
        boxes, _ = boxes_from_probability(prob_map, int(height), int(width), postprocess)
        counts.append(match_image(polygons, ignore, boxes))
    return counts


@torch.no_grad()
def compare_backends(
    reference: nn.Module,
    candidates: Mapping[str, nn.Module],
    batches: Iterable[Mapping[str, Any]],
    postprocess: PostprocessConfig,
) -> dict[str, dict[str, float]]:
    """ICDAR 2015 scores of ``reference`` and of each candidate, with their map differences.

    ``batches`` are validation batches as the text-detection loader gives them (uint8 images,
    original polygons and sizes). Returns ``{"torch": {precision, recall, hmean, images,
    matched, gt_care, det_care},
    <candidate>: {..., max_abs_prob_diff, mean_abs_prob_diff}}``; differences are in
    probability units (0..1), over every pixel of every image.
    """
    reference.eval()
    counts: dict[str, list[ImageCounts]] = {REFERENCE: [], **{name: [] for name in candidates}}
    max_diff = dict.fromkeys(candidates, 0.0)
    sum_diff = dict.fromkeys(candidates, 0.0)
    pixels = 0
    for raw in batches:
        if "image" not in raw:
            continue
        batch = to_model_inputs(dict(raw))
        expected = reference(batch["image"])["prob"].float().cpu().numpy()
        counts[REFERENCE] += _image_counts(expected, batch, postprocess)
        pixels += expected.size
        for name, network in candidates.items():
            got = network(batch["image"])["prob"].float().cpu().numpy()
            difference = np.abs(got - expected)
            max_diff[name] = max(max_diff[name], float(difference.max()))
            sum_diff[name] += float(difference.sum(dtype=np.float64))
            counts[name] += _image_counts(got, batch, postprocess)
    results: dict[str, dict[str, float]] = {}
    for name, image_counts in counts.items():
        scores = summarize(image_counts)
        entry = {
            "precision": float(scores["precision"]),
            "recall": float(scores["recall"]),
            "hmean": float(scores["hmean"]),
            "images": len(image_counts),
            "matched": int(scores["matched"]),
            "gt_care": int(scores["gt_care"]),
            "det_care": int(scores["det_care"]),
        }
        if name != REFERENCE:
            entry["max_abs_prob_diff"] = max_diff[name]
            entry["mean_abs_prob_diff"] = sum_diff[name] / max(pixels, 1)
            entry["hmean_change"] = entry["hmean"] - float(summarize(counts[REFERENCE])["hmean"])
        results[name] = entry
    return results
