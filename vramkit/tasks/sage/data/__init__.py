"""ARC data: the tasks split by task, examples with their context, batching, and the teacher's
datamodule."""
