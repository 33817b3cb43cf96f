"""A LoRA run writes checkpoints that load with weights_only=True and resume where it stopped."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers", reason="task=text_classification needs `transformers`")
pytest.importorskip("peft", reason="model.lora needs `peft`")

from vramkit.core.run.train import train

TINY_LORA = (
    "task=text_classification",
    "model=tiny_classifier",
    "+model/lora=default",
    "+hw=cpu",
    "~logger",
    "callbacks.learning_rate_monitor=null",
    "data.num_workers=0",
    "data.toy.num_train=16",
    "data.toy.num_val=8",
    "data.max_length=16",
    "hw.batch_size=4",
    "hw.val_batch_size=8",
)


@pytest.mark.slow
def test_a_lora_run_resumes_from_its_last_checkpoint(compose_config):
    first = compose_config(*TINY_LORA, "trainer.max_epochs=1")
    train(first)
    last = Path(first.paths.output_dir) / "checkpoints" / "last.ckpt"
    stopped = torch.load(last, weights_only=True)
    assert stopped["global_step"] == 4
    weights = stopped["state_dict"]
    adapters = [key for key in weights if "lora_A" in key]
    assert adapters and any("score.modules_to_save" in key for key in weights)

    train(compose_config(*TINY_LORA, "trainer.max_epochs=2", f"ckpt_path={last}"))
    resumed = torch.load(last, weights_only=True)
    assert resumed["global_step"] == 8  # went on from step 4, not from scratch
    for key, value in weights.items():
        moved = not torch.equal(value, resumed["state_dict"][key])
        trainable = "lora_" in key or "modules_to_save" in key
        assert not moved or trainable, f"frozen {key} changed"
    assert any(not torch.equal(weights[k], resumed["state_dict"][k]) for k in adapters)
