"""The global generators' states survive a checkpoint file and come back on resume."""

from __future__ import annotations

import random

import numpy as np
import torch

from vramkit.core.callbacks.checkpoints.random_state import (
    RandomState,
    capture_random_state,
    restore_random_state,
)


def _draws() -> tuple[float, float, float]:
    return random.random(), float(np.random.rand()), float(torch.rand(()))


def test_the_states_round_trip_through_a_weights_only_checkpoint(tmp_path):
    torch.manual_seed(1), np.random.seed(1), random.seed(1)
    _draws()
    torch.save({"callbacks": {"RandomState": capture_random_state()}}, tmp_path / "c.ckpt")
    expected = _draws()
    _draws()
    loaded = torch.load(tmp_path / "c.ckpt", weights_only=True)
    restore_random_state(loaded["callbacks"]["RandomState"])
    assert _draws() == expected


def test_the_callback_restores_at_train_start_not_at_load():
    callback = RandomState()
    state = callback.state_dict()
    expected = _draws()
    callback.load_state_dict(state)
    assert _draws() != expected, "nothing is restored before training starts"
    callback.on_train_start(None, None)
    assert _draws() == expected


def test_a_checkpoint_from_before_the_states_became_tensors_still_restores():
    random.seed(2), np.random.seed(2)
    name, keys, position, has_gauss, cached = np.random.get_state()
    old_format = {
        "python": random.getstate(),
        "numpy": (name, keys.tolist(), int(position), int(has_gauss), float(cached)),
        "torch": torch.get_rng_state(),
    }
    expected = _draws()
    restore_random_state(old_format)
    assert _draws() == expected


def test_the_generator_words_are_one_tensor_each_not_python_ints():
    # A checkpoint's pickler and size estimate visit every Python object it holds.
    state = capture_random_state()
    assert isinstance(state["python"][1], torch.Tensor)
    assert isinstance(state["numpy"][1], torch.Tensor)
