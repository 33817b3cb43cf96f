"""One package per workload: its networks, data, LightningModule, metrics and tools."""
