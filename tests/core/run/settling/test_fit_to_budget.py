"""A run's memory from its config (`plan_memory`): the automatic fit's overrides are what the run
then is, a CPU rehearsal records what its GPU would do, and the loader settings are the config's.

The decisions themselves are tested on the planner's side
(tests/core/planner/decisions/test_within_budget.py); here the tiny text classifier is traced.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from vramkit.core.config import settings_schemas
from vramkit.core.config.settings import Settings
from vramkit.core.hardware.detect import DeviceInfo
from vramkit.core.hardware.profile import HardwareProfile
from vramkit.core.planner.decisions import within_budget
from vramkit.core.run.settling.compose import settled_config
from vramkit.core.run.settling.fit_to_budget import (
    FIT_DECISION,
    loader_settings,
)
from vramkit.core.run.settling.settle import settle
from vramkit.core.run.train import train
from vramkit.core.units import GIB

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "planner"))
from formula_planner import formula_plan

T4 = DeviceInfo("cuda", "Tesla T4", 14.57, (7, 5), count=1, cpu_count=2)
TINY_TEXT = (
    "task=text_classification",
    "hw.batch_size=4",
    "hw.val_batch_size=4",
    "data.max_length=32",
)
needs_bitsandbytes = pytest.mark.skipif(
    importlib.util.find_spec("bitsandbytes") is None,
    reason="8-bit AdamW is a remedy only where bitsandbytes is installed (extra bnb)",
)
# Between the tiny classifier's traced training peak at batch 4 on a T4 (669,410,918 B) and at
# micro-batch 2 with accumulation (667,313,766 B, as validation at 4).
TINY_BUDGET = 668_000_000


@pytest.mark.slow
def test_the_fitted_run_is_the_run_with_the_printed_overrides(compose_config):
    """Traces the tiny classifier: auto fit on a T4 with a tiny budget, then the same command
    with the printed overrides appended; both settle to the same config."""
    memory = f"hw.memory_gib={TINY_BUDGET / GIB / 0.85}"
    fitted = settle(compose_config("+hw=t4", *TINY_TEXT, memory), device=T4)
    record = fitted.remedy_record
    assert record["applied"] and record["chosen"] == "micro-batch 2 × accumulate 2"
    printed = "\n".join(fitted.decisions).split("applies: ", 1)[1].split(" (", 1)[0].split()
    assert printed == record["overrides"] == ["hw.batch_size=2", "hw.accumulate_grad_batches=2"]
    assert fitted.remedy == ("++hw.batch_size=2", "++hw.accumulate_grad_batches=2")

    typed = settle(compose_config("+hw=t4", *TINY_TEXT, memory, *printed), device=T4)
    assert typed.remedy_record is None  # it fits as typed
    assert OmegaConf.to_container(settled_config(fitted), resolve=True) == OmegaConf.to_container(
        settled_config(typed), resolve=True
    )


@pytest.mark.slow
@needs_bitsandbytes
def test_a_rehearsed_run_writes_what_its_gpu_would_do(compose_config, monkeypatch):
    monkeypatch.setattr(within_budget, "plan_task", formula_plan)
    cfg = compose_config("+hw=t4", "hw.strict=false", *TINY_TEXT, "train=false")
    train(cfg)
    data = json.loads((Path(cfg.paths.output_dir) / FIT_DECISION).read_text())
    assert data["applied"] is False and data["profile"] == "t4"
    assert data["chosen"] == "gradient checkpointing + 8-bit AdamW"
    assert cfg.model.gradient_checkpointing is False  # the CPU rehearsal runs as requested
    assert cfg.hw.batch_size == 4


class _ShortLivedWorkers(Settings):
    persistent_workers: bool = False


def test_loader_settings_read_a_class_default_as_its_value(monkeypatch):
    # ??? in the data YAML composes as ${settings_default:…}: the planner must see the class's
    # value, not fall back to its own default (True) because the raw value is no bool
    monkeypatch.setattr(settings_schemas, "settings_class_of", lambda target: _ShortLivedWorkers)
    default = "${settings_default:some.DataModule,persistent_workers}"
    cfg = OmegaConf.create({"data": {"persistent_workers": default, "num_workers": 2}})
    settings = loader_settings(
        cfg, HardwareProfile(name="cpu", accelerator="cpu", precision="32-true")
    )
    assert settings.persistent_workers is False
    assert settings.num_workers == 2
