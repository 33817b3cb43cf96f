"""val/ece and val/brier against values computed by hand, accumulated over batches."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers", reason="task=text_classification needs `transformers`")

from vramkit.tasks.text_classification.calibration import (
    MulticlassBrierScore,
    brier_score,
    expected_calibration_error,
)
from vramkit.tasks.text_classification.hf_classifier import build_sequence_classifier
from vramkit.tasks.text_classification.pooled_features import logits_and_pooled_features

# Four samples, two classes. Top-1 confidences 0.9, 0.9, 0.6, 0.6 (bins (0.8667, 0.9333] and
# (0.5333, 0.6]); right, wrong, right, right.
PROBABILITIES = torch.tensor([[0.9, 0.1], [0.9, 0.1], [0.4, 0.6], [0.6, 0.4]])
LABELS = torch.tensor([0, 1, 1, 0])


def test_ece_over_15_bins_matches_the_hand_computation():
    # Bin of 0.9: accuracy 1/2, confidence 0.9, weight 2/4; bin of 0.6: accuracy 1, conf 0.6.
    expected = 0.5 * abs(0.5 - 0.9) + 0.5 * abs(1.0 - 0.6)
    metric = expected_calibration_error(2)
    metric.update(PROBABILITIES[:2], LABELS[:2])  # two batches: the epoch, not a batch mean
    metric.update(PROBABILITIES[2:], LABELS[2:])
    assert float(metric.compute()) == pytest.approx(expected, abs=1e-6)


def test_brier_matches_the_hand_computation_over_batches():
    per_sample = [0.01 + 0.01, 0.81 + 0.81, 0.16 + 0.16, 0.16 + 0.16]
    expected = sum(per_sample) / 4
    assert float(brier_score(PROBABILITIES, LABELS)) == pytest.approx(expected)
    metric = MulticlassBrierScore()
    metric.update(PROBABILITIES[:1], LABELS[:1])  # unequal batches weigh by their samples
    metric.update(PROBABILITIES[1:], LABELS[1:])
    assert float(metric.compute()) == pytest.approx(expected)


def test_the_pooled_feature_is_what_the_classifier_head_reads():
    model = build_sequence_classifier(
        num_labels=3,
        pad_token_id=0,
        hf_config={
            "model_type": "phi",
            "vocab_size": 16,
            "hidden_size": 8,
            "intermediate_size": 16,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
        },
    ).eval()
    input_ids = torch.tensor([[3, 4, 5, 0, 0], [6, 7, 8, 9, 10]])
    logits, pooled = logits_and_pooled_features(model, input_ids, (input_ids != 0).long())
    assert pooled.shape == (2, 8)
    torch.testing.assert_close(model.score(pooled), logits)
