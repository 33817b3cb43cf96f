"""Hugging Face text classifiers (Phi-1.5 and a tiny one), their data and LightningModule."""
