"""Installed libraries that a ``vramkit plan --hf`` process keeps from loading: the plan never
runs their code, and importing them costs seconds of CPU.

- ``bitsandbytes``: peft imports it when it is installed (``peft/helpers.py``: ``try: import
  bitsandbytes``; ``peft/tuners/lora/model.py``, ``_create_new_module``: the 8-bit and 4-bit
  dispatchers, asked through ``is_bnb_available``, which is ``importlib.util.find_spec``), and
  its import compiles kernels with ``torch.compile`` (``bitsandbytes/backends/default/ops.py``,
  ``_try_torch_compile``), which imports ``torch._inductor``: 1.2-1.5 s of CPU measured on two
  loaded cores (``import torch, lightning.pytorch, …, peft`` with and without it). The planner
  never uses it: a QLoRA layer is planned by its stand-in
  (`vramkit.core.quantization.planned_linear.PlannedQuantizedLinear`, an ``nn.Linear``), which
  peft's bitsandbytes dispatchers never match (they take ``bnb.nn.Linear8bitLt`` /
  ``bnb.nn.Linear4bit`` of a model ``loaded_in_8bit`` / ``loaded_in_4bit``), so peft wraps it
  with ``lora.Linear`` either way; the plan reads bitsandbytes' version from its metadata
  (`vramkit.core.quantization.bitsandbytes_rules.planned_bitsandbytes`).

``None`` in ``sys.modules`` is Python's own way to stop an import ("If the value is None, the
import raises ModuleNotFoundError", docs.python.org/3/reference/import.html, "The module
cache"); ``importlib.util.find_spec`` then answers None, so peft takes the library as absent.
peft caches that answer (``functools.lru_cache`` on ``is_bnb_available``) for the rest of the
process, so only a process that does nothing but plan may call `keep_unloaded`: the console
script's ``vramkit plan --hf`` without ``--verify`` (which trains the real model).
"""

from __future__ import annotations

import sys

UNLOADED = ("bitsandbytes",)
"""The libraries `keep_unloaded` keeps from loading (the module's docstring says why)."""


def keep_unloaded() -> None:
    """Keep the `UNLOADED` libraries from loading in this process; one already loaded stays."""
    for name in UNLOADED:
        sys.modules.setdefault(name, None)
