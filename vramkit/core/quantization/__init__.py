"""Quantized layers as bitsandbytes stores them: stand-ins the planner traces, and their rules."""
