"""The teacher and its features: loading the teacher, extracting its features once, the feature
cache, the student's datamodule over it, and the commands that make what is missing."""
