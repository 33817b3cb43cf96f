"""Lightning's WandB logger without the setting WandB warns about, and quiet when offline."""

from __future__ import annotations

from typing import Any

from lightning.pytorch.loggers.wandb import WandbLogger

from vramkit.core.compat import lightning_private


class WandbLoggerWithoutAnonymous(WandbLogger):
    """Lightning's ``WandbLogger``, whose ``wandb.init`` call gets no ``anonymous`` argument and,
    offline, prints no header.

    Lightning 2.6 always passes ``anonymous=None`` (lightning/pytorch/loggers/wandb.py,
    ``_wandb_init``), and WandB >= 0.22 warns "The anonymous setting has no effect and will be
    removed" for any value it is given, None included (wandb_settings.py,
    ``validate_anonymous``).

    An offline run's header (``W&B syncing is set to `offline```, where the run data is saved,
    ``wandb leet``) is printed through the run's printer, which prints nothing when the run's
    settings say ``silent`` (wandb/sdk/lib/printer.py, ``display``; wandb/sdk/wandb_run.py,
    ``_header_sync_info``). WandB's warnings and errors go through ``wandb.termwarn`` /
    ``termerror``, which read the process-wide settings of ``wandb.setup`` instead
    (wandb/errors/term.py, ``termsetup``), so they still show. The offline run's folder is
    ``<run>/wandb/`` (README, "Training"). An online run keeps its header: it names the run's
    URL. A ``settings`` argument of the user's is left as it is.
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if not kwargs.get("anonymous"):
            lightning_private.wandb_init_kwargs(self).pop("anonymous", None)
        init = lightning_private.wandb_init_kwargs(self)
        offline = lightning_private.wandb_offline(self) or init.get("mode") == "offline"
        if offline and "settings" not in kwargs:
            import wandb

            init["settings"] = wandb.Settings(silent=True)
