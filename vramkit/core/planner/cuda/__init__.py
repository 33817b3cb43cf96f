"""CUDA emulation: what the caching allocator, cuDNN, autocast and the kernels allocate.

Rules read from PyTorch's sources, each citing its file (`docs/cuda_rules.md`). Imports nothing
else of the planner but `errors`.
"""
