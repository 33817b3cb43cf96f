"""The planner's one input: "auto" interpreted once, and remedies read from the request."""

from __future__ import annotations

import types

import pytest

from vramkit.core.hardware.profile import HardwareProfile, ProfileError
from vramkit.core.planner import ModelFacts, TaskBatchDefaults, requested_batch_sizes
from vramkit.core.planner.decisions.remedies import candidate_changes
from vramkit.core.planner.request import BatchSizeRequest, batch_size_request
from vramkit.core.planner.tracing.run_setup import RunSetup

GPU = HardwareProfile(
    name="t4", accelerator="gpu", precision="16-mixed", memory_gib=14.6, compute_capability="7.5"
)
CPU = HardwareProfile(name="cpu", accelerator="cpu", precision="32-true")
DEFAULTS = TaskBatchDefaults(train=16, val=4)


def test_auto_is_searched_on_a_profile_with_a_budget():
    assert requested_batch_sizes(GPU, DEFAULTS) == (None, None)


def test_auto_takes_the_task_default_without_a_budget():
    assert requested_batch_sizes(CPU, DEFAULTS) == (16, 4)


def test_a_given_size_replaces_the_profile_and_an_int_is_kept():
    sized = GPU.model_copy(update={"val_batch_size": 8})
    assert requested_batch_sizes(sized, DEFAULTS, train=32) == (32, 8)
    assert requested_batch_sizes(sized, DEFAULTS, val="auto") == (None, None)


def test_the_request_says_which_phases_are_auto_and_the_sizes_set():
    asked = batch_size_request(GPU.model_copy(update={"batch_size": 32}))
    assert asked == BatchSizeRequest(train=32, val=None)
    assert asked.searched == (False, True) and asked.any_searched
    assert batch_size_request(CPU, train=8, val="3").sizes == (8, 3)
    assert not batch_size_request(CPU, train=8, val=3).any_searched


def test_auto_without_a_budget_or_a_default_names_the_key():
    with pytest.raises(ProfileError, match=r"batch_size_defaults\.val; give val_batch_size"):
        requested_batch_sizes(CPU, TaskBatchDefaults(train=16))


def _changes(model: ModelFacts, *, offloading: bool = False) -> dict:
    planner = types.SimpleNamespace(model=model, bitsandbytes_optimizer=None)
    setup = RunSetup("16-mixed", None, activation_offload=offloading)
    return {c.name: c for c in candidate_changes(GPU, setup, planner)}


def test_remedies_come_from_the_requests_model_facts():
    lora = {"r": 8, "alpha": 16}
    changes = _changes(ModelFacts(adam=True, lora_defaults=lora, activation_offload_available=True))
    assert changes["gradient checkpointing"].overrides == ()  # no config key: by hand
    assert "torch.utils.checkpoint" in changes["gradient checkpointing"].note
    assert changes["8-bit AdamW"].changes == {"optimizer": "adamw_8bit"}
    assert changes["LoRA r=8"].needs_consent == "lora"
    assert changes["CPU activation offload"].overrides == (
        "callbacks.activation_offload.enabled=true",
    )


def test_a_model_without_those_options_gets_none_of_their_remedies():
    changes = _changes(ModelFacts(gradient_checkpointing=True), offloading=True)
    assert not {
        "gradient checkpointing",
        "8-bit AdamW",
        "LoRA r=8",
        "CPU activation offload",
    } & set(changes)
