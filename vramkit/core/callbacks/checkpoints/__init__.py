"""Callbacks that write checkpoints or travel inside them: the resume checkpoint, periodic ones
with retention, the best finite one, the resume contract, the loader positions, the random state
and a validation still pending."""
