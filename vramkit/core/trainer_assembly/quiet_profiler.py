"""Lightning's default no-op profiler, without a generator per profiled call.

When no profiler is asked for, the Trainer runs ``PassThroughProfiler`` (``_init_profiler`` in
lightning/pytorch/trainer/setup.py), yet every callback hook, module hook, strategy hook and
training batch still enters ``profiler.profile(name)``: a ``@contextmanager`` generator
(lightning/pytorch/profilers/profiler.py, ``Profiler.profile``) that is created, started and
closed around each call only to call the empty ``start`` and ``stop``. Traced on
``benchmarks/step_overhead.py``'s tiny model that is about 2,000 Python bytecodes per training
step (``noop_profiler_bytecodes_saved`` in benchmarks/results/step_overhead.json: 1,992), the
same on bare Lightning and on vramkit: more than all of vramkit's own per-step work (1,929).
:class:`QuietPassThroughProfiler` is the same profiler whose ``profile`` hands back one shared,
reusable ``nullcontext`` (two empty Python calls per use).
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext

import lightning as L
from lightning.pytorch.profilers import PassThroughProfiler


class QuietPassThroughProfiler(PassThroughProfiler):
    """``PassThroughProfiler`` (still an instance of it) whose ``profile`` context costs two
    empty calls instead of a generator's set-up and tear-down."""

    _NOTHING = nullcontext()  # reentrant and reusable: it keeps no state between uses

    def profile(self, action_name: str) -> AbstractContextManager[None]:
        """A context that records nothing (``action_name`` is not kept)."""
        return self._NOTHING


def quiet_idle_profiler(trainer: L.Trainer) -> bool:
    """Give ``trainer`` a :class:`QuietPassThroughProfiler` where it runs Lightning's default
    ``PassThroughProfiler`` (a profiler the user asked for stays). Call it before the Trainer
    runs; returns whether it was replaced."""
    if type(trainer.profiler) is not PassThroughProfiler:
        return False
    trainer.profiler = QuietPassThroughProfiler()
    return True
