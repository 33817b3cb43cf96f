"""Training over several processes: sums and BatchNorm statistics over the whole global batch."""
