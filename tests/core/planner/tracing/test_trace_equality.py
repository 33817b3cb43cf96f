"""The fake trace allocates what a real CPU run allocates, op by op (same recorder on both)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from torch._subclasses.fake_tensor import FakeTensorMode

from vramkit.core.config.instantiate import instantiate
from vramkit.core.config.settings_schemas import file_schema, with_class_defaults
from vramkit.core.planner.cuda.cuda_rules import round_allocation
from vramkit.core.planner.tracing.batches import grow_batch
from vramkit.core.planner.tracing.fake_trace import (
    FakeStepRecorder,
    cuda_semantics,
    trace_training,
    trace_validation,
)
from vramkit.core.planner.tracing.recorder import StorageRecorder
from vramkit.core.planner.tracing.run_setup import RunSetup
from vramkit.core.planner.tracing.subject import build_module, build_optimizer

CONF_DIR = Path(__file__).resolve().parents[4] / "conf"
CPU_SETUP = RunSetup(precision="32-true", device=None)
SIDE = 64
BATCH = 2


def tiny_dbnet_config():
    content = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "model" / "dbnet_r18.yaml"))
    content.pop("defaults")  # its schema: the class defaults its ??? keys take, merged below
    cfg = OmegaConf.merge(content, with_class_defaults(file_schema(content)))
    cfg.compile = False
    cfg.channels_last = False
    cfg.net.backbone_width = 0.25
    cfg.net.inner_channels = 32
    return cfg


def dbnet_batch() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    shape = (BATCH, SIDE, SIDE)
    return {
        "image": torch.randn(BATCH, 3, SIDE, SIDE, generator=generator),
        "shrink_map": (torch.rand(shape, generator=generator) > 0.75).float(),
        "shrink_mask": torch.ones(shape),
        "thresh_map": torch.rand(shape, generator=generator),
        "thresh_mask": (torch.rand(shape, generator=generator) > 0.5).float(),
    }


def real_and_fake(model_cfg, batch, trace):
    """Trace the same step on real tensors and on fake ones, measured by the same recorder."""
    torch.manual_seed(0)
    module = instantiate(model_cfg)
    optimizer = build_optimizer(module, CPU_SETUP)
    recorder = StorageRecorder(round_bytes=round_allocation, keep_timeline=True)
    with cuda_semantics(CPU_SETUP) as (semantics, _):
        real = trace(module, optimizer, batch, recorder, semantics)

    fake_mode = FakeTensorMode()
    fake_module = build_module(lambda: instantiate(model_cfg), CPU_SETUP, fake_mode)
    one = {key: value[:1].clone() for key, value in batch.items()}
    largest = max(value.numel() for value in batch.values())
    with cuda_semantics(CPU_SETUP) as (semantics, _), fake_mode:
        fake_batch = grow_batch(one, BATCH)
        fake_optimizer = build_optimizer(fake_module, CPU_SETUP)
        # The real run is a CPU run: no cuDNN workspaces, and its Adam step counters are where
        # its parameters are; only the allocator's rounding is applied to both.
        recorder = FakeStepRecorder(
            scalar_stand_in=largest, round_to_device=True, keep_timeline=True, cuda_run=False
        )
        fake = trace(fake_module, fake_optimizer, fake_batch, recorder, semantics)
    return real, fake


def assert_same_trace(real, fake, tolerance):
    assert len(fake.timeline) == len(real.timeline) > 50
    worst = max(abs(f - r) / r for f, r in zip(fake.timeline, real.timeline, strict=True))
    assert worst <= tolerance
    assert fake.peak_bytes == pytest.approx(real.peak_bytes, rel=tolerance)
    assert fake.breakdown == pytest.approx(real.breakdown, rel=tolerance)


def test_two_adamw_steps_of_tiny_dbnet_allocate_as_a_real_cpu_run():
    real, fake = real_and_fake(tiny_dbnet_config(), dbnet_batch(), trace_training)
    # Hard-negative mining keeps a data-dependent number of pixels; the fake trace plans the
    # largest, so the loss's temporaries may differ a little. Everything else is exact.
    assert_same_trace(real, fake, tolerance=0.01)
    # At 64 px the peak is AdamW's multi-tensor step: both moments exist and a temporary as
    # large as the parameters (the square roots of the second moments) is live.
    assert real.peak_at == fake.peak_at == "step 1: optimizer step"
    assert real.breakdown["optimizer_state"] == pytest.approx(
        2 * real.breakdown["parameters"], rel=0.02
    )
    assert real.breakdown["activations"] >= real.breakdown["gradients"]


def test_an_mlp_trace_matches_the_real_run_exactly():
    model = OmegaConf.create(
        {
            "_target_": "planning_models.TinyConvClassifier",
            "optimizer": {"_target_": "torch.optim.AdamW", "_partial_": True},
            "channels": 8,
            "blocks": 2,
        }
    )
    batch = {"image": torch.randn(BATCH, 3, 32, 32), "label": torch.tensor([1, 7])}
    real, fake = real_and_fake(model, batch, trace_training)
    assert fake.timeline == real.timeline
    val_real, val_fake = real_and_fake(model, batch, trace_validation)
    # On the host, a real tensor's .numpy() shares its memory and keeps it alive a little longer
    # than the zeros a fake tensor gives; the device side, and so the peak, is the same.
    assert (val_fake.peak_bytes, val_fake.breakdown) == (val_real.peak_bytes, val_real.breakdown)
    assert val_fake.peak_at == "validation step"
    # Validation inside fit keeps gradients and optimizer state resident.
    assert val_real.breakdown["gradients"] > 0
    assert val_real.breakdown["optimizer_state"] > 0
