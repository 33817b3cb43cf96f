"""OOM recovery: the LightningModule mixin, its step runners, the retry policy, batch splitting."""
