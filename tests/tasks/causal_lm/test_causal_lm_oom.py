"""A causal-LM fine-tune survives an injected OOM with the whole batch's gradients.

Its loss is a mean over the labelled next tokens, and the samples of a batch have different
numbers of them (different prompt and response lengths): weighted by samples, a split step's
gradients would differ; weighted by tokens (`micro_batch_weight`) they are the whole batch's.
"""

from __future__ import annotations

from functools import partial

import pytest
import torch

pytest.importorskip("transformers", reason="task=causal_lm needs `transformers`")
pytest.importorskip("peft", reason="model.finetune=lora needs `peft`")

from vramkit.tasks.causal_lm.module import CausalLMModule

TINY_LLAMA = {
    "vocab_size": 40,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "max_position_embeddings": 32,
}
RTOL = 1e-5  # float32 sums over two halves of the batch: ~1e-7 of the largest entry measured


def _batch() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(4, 40, (4, 12), generator=generator)
    labels = ids.clone()
    for row, prompt in enumerate((2, 9, 4, 10)):  # 9, 2, 7 and 1 labelled next tokens
        labels[row, :prompt] = -100
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}


def _module() -> CausalLMModule:
    torch.manual_seed(0)
    return CausalLMModule(
        optimizer=partial(torch.optim.SGD, lr=0.1),
        config="llama",
        config_overrides=TINY_LLAMA,
        finetune="lora",
        lora={"r": 4, "dropout": 0.0},
    )


@pytest.mark.parametrize("train_above", [2, 1])
def test_a_split_training_step_has_the_whole_batch_gradients(oom_rehearsal, train_above):
    batch = _batch()
    reference, _ = oom_rehearsal.step_gradients(_module, batch)
    recovered, module = oom_rehearsal.step_gradients(_module, batch, train_above=train_above)
    assert module.oom_state.train_micro_batch == train_above
    oom_rehearsal.assert_same_gradients(recovered, reference, rtol=RTOL)
