"""Lightning's WandB logger without the setting WandB warns about on every run."""

from __future__ import annotations

from typing import Any

from lightning.pytorch.loggers.wandb import WandbLogger


class WandbLoggerWithoutAnonymous(WandbLogger):
    """Lightning's ``WandbLogger``, whose ``wandb.init`` call gets no ``anonymous`` argument.

    Lightning 2.6 always passes ``anonymous=None`` (lightning/pytorch/loggers/wandb.py,
    ``_wandb_init``), and WandB >= 0.22 warns "The anonymous setting has no effect and will be
    removed" for any value it is given, None included (wandb_settings.py,
    ``validate_anonymous``). Everything else is Lightning's logger as it is.
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if not kwargs.get("anonymous"):
            self._wandb_init.pop("anonymous", None)
