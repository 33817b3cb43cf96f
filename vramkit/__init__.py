"""vramkit: PyTorch Lightning + Hydra training that plans for the GPU you actually have."""

__version__ = "0.1.0"
