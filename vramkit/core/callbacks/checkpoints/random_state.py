"""The run's global random generators travel with its checkpoints."""

from __future__ import annotations

import logging
import random
from typing import Any

import lightning as L
import numpy as np
import torch
from lightning.pytorch.trainer.states import TrainerFn

from vramkit.core.callbacks.checkpoints.pending_validation import validation_pending

log = logging.getLogger(__name__)


def capture_random_state() -> dict[str, Any]:
    """The states of Python's ``random``, NumPy's global generator, torch's CPU generator and,
    once CUDA is initialised, every CUDA device's generator."""
    state: dict[str, Any] = {
        "python": _python_state_plain(random.getstate()),
        "numpy": _numpy_state_plain(np.random.get_state()),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


# Both Mersenne Twisters keep 624-625 words. As Python ints each word is one more object for
# the checkpoint's pickler and its size estimate to visit (about 2 ms of every write, which
# last.ckpt makes every few dozen steps); as one tensor they are one storage record. A tensor
# also loads under torch.load(weights_only=True), which refuses NumPy arrays.


def _python_state_plain(state: tuple[Any, ...]) -> tuple[Any, ...]:
    version, words, gauss_next = state
    return (version, torch.tensor(words, dtype=torch.int64), gauss_next)


def _python_state_from_plain(state: tuple[Any, ...]) -> tuple[Any, ...]:
    version, words, gauss_next = state
    # Checkpoints written before the words became a tensor hold them as a tuple or list.
    words = words.tolist() if isinstance(words, torch.Tensor) else words
    return (version, tuple(words), gauss_next)


def _numpy_state_plain(state: tuple[Any, ...]) -> tuple[Any, ...]:
    # ("MT19937", uint32 keys, pos, has_gauss, cached_gaussian)
    name, keys, position, has_gauss, cached_gaussian = state
    keys = torch.from_numpy(keys.astype(np.int64))
    return (name, keys, int(position), int(has_gauss), float(cached_gaussian))


def _numpy_state_from_plain(state: tuple[Any, ...]) -> tuple[Any, ...]:
    name, keys, position, has_gauss, cached_gaussian = state
    keys = keys.numpy() if isinstance(keys, torch.Tensor) else keys  # older checkpoints: a list
    return (name, np.asarray(keys, dtype=np.uint32), position, has_gauss, cached_gaussian)


def restore_random_state(state: dict[str, Any]) -> None:
    """Set the generators to ``state`` (from :func:`capture_random_state`).

    CUDA states are restored only onto as many devices as were saved; a checkpoint from another
    device count, or from a CPU run, leaves the CUDA generators as they are and says so.
    """
    random.setstate(_python_state_from_plain(state["python"]))
    np.random.set_state(_numpy_state_from_plain(state["numpy"]))
    torch.set_rng_state(state["torch"])
    cuda_states = state.get("cuda")
    if cuda_states is None or not torch.cuda.is_available():
        return
    if len(cuda_states) != torch.cuda.device_count():
        log.warning(
            "the checkpoint holds the CUDA generators of %d devices, this machine has %d: "
            "they are not restored, so CUDA random numbers (dropout) differ from the saved run",
            len(cuda_states),
            torch.cuda.device_count(),
        )
        return
    torch.cuda.set_rng_state_all(cuda_states)


class RandomState(L.Callback):
    """Saves the global random generators with every checkpoint and restores them when a run
    resumes, so dropout and every other draw in the training step continue where they were.

    The states are taken when the checkpoint is written and set back at ``on_train_start`` of
    the resumed run: by then the resumed process has built its model and loaders (which draw
    random numbers of their own), and nothing between that hook and the next training step
    draws any. vramkit's loaders take nothing from these generators
    (:mod:`vramkit.core.data.sample_seeds`), so the states at a step boundary are all a
    continuation needs.

    A checkpoint written during a fit's validation pass resumes at that pass's first batch
    (:mod:`vramkit.core.callbacks.checkpoints.pending_validation`), so it holds the states taken
    when the
    pass began: the pass replays with the same random numbers, and training after it goes on
    with the ones the uninterrupted run had.
    """

    def __init__(self) -> None:
        self._saved: dict[str, Any] | None = None  # states read from a checkpoint, not yet set
        # (trainer, states at its validation pass's start) while a fit validates
        self._validation_start: tuple[L.Trainer, dict[str, Any]] | None = None

    def state_dict(self) -> dict[str, Any]:
        if self._validation_start is not None:
            trainer, states = self._validation_start
            if validation_pending(trainer):
                return states
        return capture_random_state()

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.state.fn == TrainerFn.FITTING and not trainer.sanity_checking:
            self._validation_start = (trainer, capture_random_state())

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._validation_start = None

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._saved = state_dict

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._saved is not None:
            restore_random_state(self._saved)
            self._saved = None
