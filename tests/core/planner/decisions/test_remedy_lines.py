"""Every remedy line the planner prints for the Phi-1.5 example composes as printed."""

from __future__ import annotations

import types

import pytest
from omegaconf import OmegaConf

from vramkit.core.hardware.profile import HardwareProfile
from vramkit.core.planner.decisions.remedies import candidate_changes, combined
from vramkit.core.planner.tracing.run_setup import RunSetup
from vramkit.core.planner.tracing.sharding import DDP, Sharding
from vramkit.core.run.settling.compose import CONF_DIR, compose_config
from vramkit.core.run.settling.plan_request_from_config import model_facts
from vramkit.core.run.settling.resolvers import register_resolvers

# docs/planner.md's worked example: Phi-1.5 as a classifier on a 16 GB laptop GPU.
EXAMPLE = ["+hw=rtx4090_laptop", "task=text_classification", "model=phi15", "hw.batch_size=8"]


def _example_changes(tmp_path):
    register_resolvers()
    cfg = compose_config("train", EXAMPLE, output_dir=tmp_path)
    profile = types.SimpleNamespace(bf16=True)  # the laptop GPU has bf16 (conf/hw/rtx4090_laptop)
    # Two GPUs under DDP: the "ZeRO-2 across 2 GPUs" line too.
    setup = RunSetup(precision="16-mixed", device=None, devices=2, sharding=Sharding(DDP, 2))
    model = model_facts(cfg, cfg.model)
    planner = types.SimpleNamespace(
        model=model, bitsandbytes_optimizer=model.bitsandbytes_optimizer
    )
    singles = candidate_changes(profile, setup, planner)
    pairs = [
        pair
        for i, first in enumerate(singles)
        for second in singles[i + 1 :]
        if (pair := combined(first, second)) is not None
    ]
    return singles + pairs


def test_the_example_offers_every_kind_of_remedy(tmp_path):
    changes = _example_changes(tmp_path)
    names = {change.name for change in changes}
    assert {"gradient checkpointing", "8-bit AdamW", "bf16-true", "CPU activation offload"} <= names
    assert {"LoRA r=16", "QLoRA r=16, 4-bit base"} <= names
    assert {"DeepSpeed ZeRO-2, CPU offload", "DeepSpeed ZeRO-2 across 2 GPUs"} <= names
    assert "gradient checkpointing + 8-bit AdamW" in names
    for change in changes:  # LoRA changes what is trained: it waits for the user's consent
        assert ("lora" in change.needs_consent.split(",")) == ("LoRA" in change.name), change.name


def _assert_composes(overrides, tmp_path):
    assert overrides, "a remedy of the example is a list of overrides, not prose"
    cfg = compose_config("train", [*EXAMPLE, *overrides], output_dir=tmp_path)
    for override in overrides:
        key, value = override.split("=", 1)
        if key == "+model/lora":  # a config group option: the whole model.lora block
            option = OmegaConf.load(CONF_DIR / "model" / "lora" / f"{value}.yaml")
            assert cfg.model.lora.target_modules == option.target_modules
        elif key == "trainer":
            assert cfg.trainer.strategy._target_.endswith("DeepSpeedStrategy")
        else:
            assert str(OmegaConf.select(cfg, key)).lower() == value.lower(), override


def test_every_single_remedy_line_composes_as_printed(tmp_path):
    micro_batch = ("hw.batch_size=2", "hw.accumulate_grad_batches=4", "hw.val_batch_size=4")
    singles = [c.overrides for c in _example_changes(tmp_path) if " + " not in c.name]
    for overrides in [*singles, micro_batch]:
        _assert_composes(overrides, tmp_path)


@pytest.mark.slow
def test_every_paired_remedy_line_composes_as_printed(tmp_path):
    for change in _example_changes(tmp_path):
        if " + " in change.name:
            _assert_composes(change.overrides, tmp_path)


def test_a_profile_with_a_field_typo_in_a_remedy_would_be_refused(tmp_path):
    register_resolvers()
    with pytest.raises(Exception, match="precison"):
        compose_config("train", [*EXAMPLE, "hw.precison=bf16-true"], output_dir=tmp_path)


def test_the_profile_stub_matches_the_laptop_profile():
    laptop = OmegaConf.load(CONF_DIR / "hw" / "rtx4090_laptop.yaml")
    assert laptop.bf16 is True
    assert "bf16" in HardwareProfile.model_fields


def _runs_on_cpu(overrides: tuple[str, ...]) -> bool:
    # DeepSpeed needs CUDA; everything else the planner proposes runs on this CPU.
    return not any(o.startswith("trainer=deepspeed") for o in overrides)


# The example at tiny size on this CPU: the same task, a two-layer Phi, a few steps.
TINY = [
    "task=text_classification",
    "model=tiny_classifier",
    "+hw=cpu",
    "debug=fdr",
    "data.toy.num_train=16",
    "data.toy.num_val=8",
    "data.max_length=16",
    "hw.batch_size=4",
    "hw.val_batch_size=4",
]


# What the slow test below trains: every CPU-runnable line the planner prints for the example
# (checked by the next test), the micro-batch remedy, and the combination.
CPU_LINES = {
    "checkpointing": ("model.gradient_checkpointing=true",),
    "adamw8bit": ("model.optimizer._target_=bitsandbytes.optim.AdamW8bit",),
    "bf16_true": ("hw.precision=bf16-true",),
    "lora": ("+model/lora=default",),
    "qlora": ("+model/lora=default", "model.lora.quantize=4bit"),
    "offload": ("callbacks.activation_offload.enabled=true",),
    "micro_batch": ("hw.batch_size=2", "hw.accumulate_grad_batches=2"),
    "lora_adamw8bit_checkpointing": (
        "+model/lora=default",
        "model.optimizer._target_=bitsandbytes.optim.AdamW8bit",
        "model.gradient_checkpointing=true",
    ),
}


def test_the_tiny_runs_cover_every_line_that_runs_on_a_cpu(tmp_path):
    for change in _example_changes(tmp_path):
        if not _runs_on_cpu(change.overrides):
            continue
        parts = set(change.overrides)
        covered = {line for lines in CPU_LINES.values() for line in lines}
        assert parts <= covered, change.name


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CPU_LINES))
def test_a_remedy_line_trains_a_tiny_phi_on_the_cpu(compose_config, name):
    pytest.importorskip("peft")
    pytest.importorskip("bitsandbytes")
    from vramkit.core.run.train import train

    accuracy = train(compose_config(*TINY, *CPU_LINES[name]))
    assert accuracy is not None and 0.0 <= accuracy <= 1.0
