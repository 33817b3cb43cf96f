"""The text classifier survives injected OOMs with the whole batch's gradients and metrics.

Its loss is a cross-entropy averaged over samples (one label each, padding never scored), so
the mixin's default weight, samples, is the right one; the batch's texts have different lengths
so that padding and the last-token pooling are exercised.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers", reason="task=text_classification needs `transformers`")

from vramkit.tasks.text_classification.module import TextClassificationModule

PHI = {
    "model_type": "phi",
    "vocab_size": 32,
    "hidden_size": 16,
    "intermediate_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "max_position_embeddings": 32,
    "bos_token_id": None,
    "eos_token_id": None,
}
# float32 sums over a batch taken in two halves: a few ulps (1.2e-7) of the largest terms;
# 1e-5 of the largest gradient entry is a wide margin over the ~1e-7 measured.
RTOL = 1e-5


def _batch(seed: int, samples: int = 4, tokens: int = 10) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, tokens + 1, (samples,), generator=generator)
    mask = (torch.arange(tokens)[None, :] < lengths[:, None]).long()
    ids = torch.randint(1, PHI["vocab_size"], (samples, tokens), generator=generator) * mask
    labels = torch.randint(0, 3, (samples,), generator=generator)
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def _module() -> TextClassificationModule:
    torch.manual_seed(0)
    return TextClassificationModule(
        num_labels=3,
        pad_token_id=0,
        hf_config=PHI,
        optimizer=lambda params: torch.optim.SGD(params, lr=0.1),
    )


@pytest.mark.parametrize("train_above", [2, 1])
def test_a_split_training_step_has_the_whole_batch_gradients(oom_rehearsal, train_above):
    batch = _batch(0)
    reference, _ = oom_rehearsal.step_gradients(_module, batch)
    recovered, module = oom_rehearsal.step_gradients(_module, batch, train_above=train_above)
    assert module.oom_state.train_micro_batch == train_above
    oom_rehearsal.assert_same_gradients(recovered, reference, rtol=RTOL)


def test_split_validation_gives_the_same_metrics(oom_rehearsal):
    batches = [_batch(1), _batch(2, samples=3)]
    reference, _ = oom_rehearsal.validation_metrics(_module, batches)
    recovered, module = oom_rehearsal.validation_metrics(_module, batches, val_above=1)
    assert module.oom_state.val_micro_batch == 1
    # accuracy: a sample-weighted mean of 0/1 values, merged exactly
    assert recovered["val/accuracy"] == pytest.approx(reference["val/accuracy"], abs=1e-7)
    assert recovered["val/loss"] == pytest.approx(reference["val/loss"], rel=1e-6)
