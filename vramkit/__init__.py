"""vramkit: PyTorch Lightning + Hydra training that plans for the GPU you actually have."""

import os

# libgomp (PyTorch's CPU OpenMP on Linux) lets idle threads spin at every barrier before they
# sleep; on a CPU shared with other processes the spinning takes the cores the work needs.
# Measured with the default job on 2 cores beside two CPU-bound processes: epoch 0 took 3.7 min
# spinning, 1.7 min with passive waiting; on the quiet machine 45 s either way. Set before
# torch loads OpenMP (every entry point imports vramkit first); a value the user set is kept.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

__version__ = "0.1.0"


def __getattr__(name: str):
    """``vramkit.plan`` and ``vramkit.plan_hf`` (`vramkit.api`), imported on first use:
    ``import vramkit`` stays cheap, and every entry point imports vramkit before anything else."""
    if name in ("plan", "plan_hf"):
        from vramkit import api

        return getattr(api, name)
    raise AttributeError(f"module 'vramkit' has no attribute {name!r}")
