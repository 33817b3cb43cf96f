"""The tiny experiments train end to end on the CPU: the loss falls, LoRA and QLoRA alike, and
a run stopped after its first epoch and resumed ends where the uninterrupted run ends."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch
from omegaconf import DictConfig

pytest.importorskip("transformers", reason="task=causal_lm needs `transformers`")
pytest.importorskip("peft", reason="model.finetune=lora needs `peft`")

from vramkit.core.run.settling import compose
from vramkit.core.run.train import train

SHORT = (
    "+hw=cpu",
    "logger=csv",
    "callbacks.learning_rate_monitor=null",
    "callbacks.progress_bar.refresh_rate=0",
    "data.num_workers=0",
    "trainer.max_time=null",  # a wall-clock limit would make the runs differ
    "+trainer.limit_train_batches=10",
    "+trainer.limit_val_batches=2",
    "hw.batch_size=8",
    "hw.val_batch_size=40",
    "data.seq_len=24",
    # The schedule spans the run's max_epochs: constant after the warm-up, a run of one epoch
    # is the first epoch of a run of two, so stopping after it is an interruption.
    "model.lr_schedule.decay=constant",
)


@pytest.fixture
def run_config(tmp_path: Path, shared_data_dir: Path):
    """Compose a run whose records go to ``tmp_path/<folder>``: each run its own folder."""

    def _compose(folder: str, *overrides: str) -> DictConfig:
        # Paths as overrides: a run composes its config again from them.
        paths = (f"paths.log_dir={tmp_path / 'logs'}", f"paths.data_dir={shared_data_dir}")
        return compose.compose_config(
            "train", (*SHORT, *overrides, *paths), output_dir=tmp_path / folder
        )

    yield _compose
    compose.forget_composition()  # later tests must not see this run's Hydra settings


def _val_losses(run_dir: Path) -> list[float]:
    # A resumed run logs into a new csv version beside the first's: read them in order.
    rows = [
        row for path in sorted(run_dir.rglob("metrics.csv")) for row in csv.DictReader(path.open())
    ]
    return [float(row["val/loss"]) for row in rows if row.get("val/loss")]


def _last(run_dir: Path) -> dict:
    return torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)


@pytest.mark.slow
def test_lora_loss_falls_and_a_resumed_run_equals_the_uninterrupted_one(run_config):
    whole = run_config("whole", "experiment=llm_lora_tiny", "trainer.max_epochs=2")
    train(whole)
    whole_dir = Path(whole.paths.output_dir)
    losses = _val_losses(whole_dir)
    assert len(losses) == 2 and losses[-1] < losses[0] - 0.2, losses

    first = run_config("stopped", "experiment=llm_lora_tiny", "trainer.max_epochs=1")
    train(first)
    stopped_dir = Path(first.paths.output_dir)
    last = stopped_dir / "checkpoints" / "last.ckpt"
    assert _last(stopped_dir)["global_step"] == 10
    train(
        run_config(
            "stopped", "experiment=llm_lora_tiny", "trainer.max_epochs=2", f"ckpt_path={last}"
        )
    )
    resumed, expected = _last(stopped_dir), _last(whole_dir)
    assert resumed["global_step"] == expected["global_step"] == 20
    # Equal to float32 rounding: the adapters differ by at most 7e-8 (measured), the order of the
    # data, the schedule and the optimizer's state are the same (a wrong batch order or a lost
    # moment moves them by 1e-3 and more).
    for key, value in expected["state_dict"].items():
        torch.testing.assert_close(resumed["state_dict"][key], value, rtol=1e-5, atol=1e-6)
    adapters = [key for key in expected["state_dict"] if "lora_" in key]
    assert adapters and len(expected["optimizer_states"][0]["state"]) == len(adapters)
    for index, state in expected["optimizer_states"][0]["state"].items():
        for name, value in state.items():
            got = resumed["optimizer_states"][0]["state"][index][name]
            torch.testing.assert_close(got, value, rtol=1e-3, atol=1e-7)


@pytest.mark.slow
def test_qlora_trains_adapters_over_a_4bit_base_and_resumes(run_config):
    first = run_config("qlora", "experiment=llm_qlora_tiny", "trainer.max_epochs=1")
    train(first)
    run_dir = Path(first.paths.output_dir)
    last = run_dir / "checkpoints" / "last.ckpt"
    train(
        run_config(
            "qlora", "experiment=llm_qlora_tiny", "trainer.max_epochs=2", f"ckpt_path={last}"
        )
    )
    losses = _val_losses(run_dir)
    assert len(losses) == 2 and losses[-1] < losses[0], losses
    checkpoint = _last(run_dir)
    assert checkpoint["global_step"] == 20
    weights = checkpoint["state_dict"]
    packed = [key for key, value in weights.items() if key.endswith("base_layer.weight")]
    assert len(packed) == 14 and all(weights[key].dtype == torch.uint8 for key in packed)
    assert weights["model.base_model.model.lm_head.weight"].dtype == torch.float32
