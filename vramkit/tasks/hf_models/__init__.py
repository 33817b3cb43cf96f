"""Any Hugging Face model from its config (random weights) on random data, to plan or train."""
