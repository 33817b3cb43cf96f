"""Callbacks about GPU memory: per-phase monitoring, cleaning between training and validation,
activation offloading, and injected OOMs to rehearse recovery."""
