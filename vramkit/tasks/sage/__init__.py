"""SAGE: ARC grid tasks, the teacher and student networks, feature extraction and cache, and
their LightningModules."""
