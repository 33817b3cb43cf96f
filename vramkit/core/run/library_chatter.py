"""Other libraries' messages that a vramkit command does not show, each with the reason.

A default run prints vramkit's lines, its progress and real problems. The lines
below are hidden by their exact text or logger, never by a level or a whole library, so a new
message from the same library still shows. Where vramkit caused a message it is fixed at the
cause instead (checkpoints are saved with ``weights_only`` given, eval loads its checkpoint
once, ``trainer.enable_model_summary`` is off beside vramkit's own summary callback, the WandB
logger passes no ``anonymous`` setting).

``verbose=true`` (a top-level key of conf/train.yaml, conf/eval.yaml and conf/export.yaml), or a
root log level of DEBUG (``hydra.verbose=true``), shows everything.
"""

from __future__ import annotations

import logging
import os
import warnings

from vramkit.core.config.settings import Settings
from vramkit.core.config.source import ConfigSource, command_line_overrides

HIDDEN_LINE_STARTS: dict[str, tuple[str, ...]] = {
    "lightning.pytorch.utilities.rank_zero": (
        # Advertisements for Lightning's cloud products, printed by every Trainer.
        "💡 Tip: ",
        # vramkit's "hardware profile" lines already name the device and why it was chosen.
        "GPU available: ",
        "TPU available: ",
        # The learning-rate schedule asks for trainer.estimated_stepping_batches, which loads the
        # training loader early: expected, not a problem.
        "Loading `train_dataloader` to estimate number of stepping batches",
        # The fit's planned end (loops/fit_loop.py, FitLoop.done): vramkit's summary and the
        # best-checkpoint line follow it. Other stops (no training batches) still show.
        "`Trainer.fit` stopped: `max_epochs=",
        "`Trainer.fit` stopped: `max_steps=",
        # Lightning's Timer (callbacks/timer.py) when trainer.max_time ends the fit: vramkit's
        # summary says the same with the step reached and how to resume (run_summary.py).
        "Time limit reached. Elapsed time is ",
    ),
    # scripts/export.py: the dynamo exporter registers torchvision's operators when it can; the
    # DBNet export uses none of them (four lines, one per operator).
    "torch.onnx._internal.exporter._registration": ("torchvision is not installed. Skipping ",),
    # onnxruntime's static quantizer logs to the root logger, one line per tensor it leaves in
    # float, as intended (the image input, fp32_modules).
    "root": ("Quantization parameters for tensor:",),
    # bitsandbytes on a CPU with AVX512-BF16 tries an optional kernel package at import (peft
    # imports it: a LoRA run, an in-process plan; `vramkit plan --hf` keeps it unloaded); without
    # the package it uses its own kernel.
    "bitsandbytes.backends.cpu.ops": ("Failed to load CPU gemm_4bit_forward from kernels-",),
}
"""Logger name -> starts of the lines hidden on it."""

QUIET_LOGGERS: tuple[str, ...] = (
    # The ONNX exporter's graph passes report each step at INFO ("Removed 259 unused nodes",
    # "Applied 63 of general pattern rewrite rules"): progress notes, not results.
    "onnx_ir.passes",
    "onnxscript.optimizer",
    "onnxscript.rewriter",
)
"""Loggers that show WARNING and above only."""

HIDDEN_WARNINGS: tuple[tuple[str, type[Warning]], ...] = (
    # Lightning 2.6's own pytree helper builds torch's deprecated LeafSpec on every batch
    # transfer; nothing a user can change (Lightning's to fix).
    (r"`isinstance\(treespec, LeafSpec\)` is deprecated", FutureWarning),
    # PEFT reads transformers' deprecated alias is_gradient_checkpointing when it wraps a model
    # for LoRA (peft_model.py); PEFT's to fix.
    (r"`is_gradient_checkpointing` is deprecated", FutureWarning),
)
"""(message regex, category) of the Python warnings hidden."""

QUIET_ENVIRONMENT: dict[str, str] = {
    # WandB's 30-line history and summary block at the end of every run repeats what vramkit's
    # tables print; its first lines (offline run folder, how to sync) still show.
    "WANDB_QUIET": "true",
}
"""Environment variables set (unless the user set them) for a quiet run."""


class OutputSettings(Settings):
    """The top-level key that decides how much of other libraries' output a command shows."""

    verbose: bool = False
    """true: show every library's messages, also those vramkit hides as chatter."""


class _HiddenLines(logging.Filter):
    """Drops the records whose message starts with one of ``starts``."""

    def __init__(self, starts: tuple[str, ...]) -> None:
        super().__init__()
        self.starts = starts

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(self.starts)


def output_settings(verbose: object, *, config_file: str) -> OutputSettings:
    """``verbose`` checked (a `ConfigError` names the key and ``config_file``)."""
    return OutputSettings.from_config(
        {} if verbose is None else {"verbose": verbose},
        key_prefix="",
        source=ConfigSource(config_file, command_line_overrides()),
        title="invalid output settings",
    )


def hide_library_chatter(settings: OutputSettings) -> None:
    """Hide the lines listed in this module for the rest of the process, unless
    ``settings.verbose`` or the root logger shows DEBUG records. A verbose call takes the line
    filters off again (a test process runs quiet and verbose commands in turn)."""
    verbose = settings.verbose or logging.getLogger().isEnabledFor(logging.DEBUG)
    for name, starts in HIDDEN_LINE_STARTS.items():
        logger = logging.getLogger(name)
        for existing in [f for f in logger.filters if isinstance(f, _HiddenLines)]:
            logger.removeFilter(existing)
        if not verbose:
            logger.addFilter(_HiddenLines(starts))
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.NOTSET if verbose else logging.WARNING)
    if verbose:
        return
    for message, category in HIDDEN_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category)
    for name, value in QUIET_ENVIRONMENT.items():
        os.environ.setdefault(name, value)
