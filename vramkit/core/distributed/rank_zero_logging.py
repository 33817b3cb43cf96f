"""One voice per run: processes other than rank 0 of a data-parallel run log only errors.

Every process of a DDP run executes the same code on the same config, so each info line and
warning of process 1 repeats one of process 0 (Lightning's launcher gives them one terminal,
``lightning/pytorch/strategies/launchers/subprocess_script.py``). Lightning silences its own
messages the same way (``rank_zero_info`` / ``rank_zero_warn``); this does it once for vramkit,
its libraries and Python's ``warnings``, instead of at each call. A message that only one
process can give (its own out-of-memory recovery) passes with ``extra=EVERY_PROCESS``.
"""

from __future__ import annotations

import logging
import warnings

from lightning.fabric.utilities.rank_zero import rank_zero_only

EVERY_PROCESS = {"every_process": True}
"""``log.warning(..., extra=EVERY_PROCESS)``: printed by whichever process logs it."""


class _ErrorsAndOwnMessages(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.ERROR or getattr(record, "every_process", False)


def quiet_other_processes() -> None:
    """On a process of rank > 0, keep errors and ``EVERY_PROCESS`` records only; ignore warnings.

    Call it once logging is configured (Hydra sets up the handlers before the task function).
    The filter goes on every handler there is: the root logger's, which propagated records
    reach, and those of loggers that do not propagate (``lightning.pytorch`` keeps a handler of
    its own when it is imported before logging is configured, ``lightning/pytorch/__init__.py``).
    """
    if rank_zero_only.rank == 0:
        return
    keep = _ErrorsAndOwnMessages()
    loggers = [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]
    for logger in loggers:
        for handler in getattr(logger, "handlers", ()):  # placeholders have none
            handler.addFilter(keep)
    warnings.simplefilter("ignore")
