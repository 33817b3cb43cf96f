"""Tracing: one training, validation and inference step of the real module on fake tensors.

Records every allocation and free; built on `cuda` (what each op allocates) and `shortcuts`.
"""
