"""Lightning's model summary with counted FLOPs instead of a column of zeros."""

from __future__ import annotations

import logging
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import RichModelSummary
from lightning.pytorch.utilities.model_summary import summarize
from pydantic import Field
from torch.utils.flop_counter import FlopCounterMode

from vramkit.core.compat import lightning_private, torch_private
from vramkit.core.config.settings import Settings
from vramkit.core.data.batches import batch_size_of
from vramkit.core.trainer_assembly.batch_hooks import switch_batch_hook

log = logging.getLogger(__name__)


class RunModelSummarySettings(Settings):
    """The keys of ``callbacks.model_summary`` (conf/callbacks/model_summary.yaml)."""

    max_depth: int = Field(1, ge=0)
    """Levels of nested modules listed; 0 prints no summary."""


class RunModelSummary(RichModelSummary):
    """The summary table of Lightning's ``RichModelSummary``, with FLOPs that were counted.

    Lightning counts FLOPs only over a forward pass of ``example_input_array``
    (lightning/pytorch/utilities/model_summary/model_summary.py, ``_forward_example_input``);
    a module without one gets a FLOPs column of zeros and "Total FLOPs: 0". Here such a module's
    summary waits for the first training step, which runs under
    ``torch.utils.flop_counter.FlopCounterMode`` as the throughput monitor counts its steps: the
    real batch, forward and backward, with no extra pass (BatchNorm statistics and the random
    stream stay as they are). A module with an ``example_input_array`` gets Lightning's summary
    at the start of the fit, as before. A compiled model is summarised without FLOPs: counting
    makes it fall back to eager (pytorch/pytorch#140909).

    Its keys are the fields of `RunModelSummarySettings`, given as keyword arguments
    and kept validated in ``self.settings`` (see `vramkit.core.config.settings`).
    """

    settings_class = RunModelSummarySettings

    def __init__(self, **settings: Any) -> None:
        self.settings = RunModelSummarySettings.for_component(type(self), settings)
        super().__init__(max_depth=self.settings.max_depth)
        self._waiting = False  # the summary waits for the first training step
        self._counter: FlopCounterMode | None = None
        self._batch_size: int | None = None
        self.total_flops: int | None = None  # of the counted step (forward + backward)

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not self.settings.max_depth:
            return
        if pl_module.example_input_array is not None or _is_compiled(pl_module):
            super().on_fit_start(trainer, pl_module)
            return
        self._waiting = True

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if not self._waiting or self._counter is not None:
            return
        self._batch_size = batch_size_of(batch)
        self._counter = FlopCounterMode(display=False, depth=self.settings.max_depth + 1)
        self._counter.__enter__()

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *_: Any) -> None:
        counter = self._stop_counting()
        if counter is None:
            return
        flops = counter.get_total_flops()
        if flops == 0:
            return  # a batch that ran no model (every image unreadable): count the next one
        self._waiting = False
        self.total_flops = int(flops)
        summary = summarize(pl_module, max_depth=self.settings.max_depth)
        # The table reads its FLOPs from the summary's own counter (flop_counts, total_flops),
        # which saw no forward pass: it gets the counts of the real step instead.
        lightning_private.set_summary_flop_counter(summary, _StepFlops(counter, pl_module))
        if trainer.is_global_zero:
            self.summarize(
                lightning_private.summary_rows(summary),
                summary.total_parameters,
                summary.trainable_parameters,
                summary.model_size,
                summary.total_training_modes,
                total_flops=self.total_flops,
            )
            log.info(
                "FLOPs above: forward and backward of the first training batch (%s samples), "
                "counted by torch.utils.flop_counter",
                self._batch_size if self._batch_size is not None else "?",
            )
        # nothing left to do per step
        switch_batch_hook(self, "on_train_batch_start", on=False)
        switch_batch_hook(self, "on_train_batch_end", on=False)

    def on_exception(
        self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException
    ) -> None:
        self._stop_counting()

    def _stop_counting(self) -> FlopCounterMode | None:
        counter, self._counter = self._counter, None
        if counter is not None:
            counter.__exit__(None, None, None)
        return counter


class _StepFlops:
    """A step's FLOP counts under the names Lightning's summary looks them up by.

    The summary looks a layer up as ``<LightningModule class>.<layer path>``, the name the
    counter's module tracker gives when the LightningModule's own ``forward`` runs. A
    ``training_step`` that calls ``self.net(...)`` directly is tracked under the child's class
    (``DBNet``, ``DBNet.backbone``): those names are mapped back to the layer paths.
    Two direct children of one class would share their counts.
    """

    def __init__(self, counter: FlopCounterMode, pl_module: L.LightningModule) -> None:
        self._counter = counter
        self._prefix = type(pl_module).__name__
        self._children = {name: type(child).__name__ for name, child in pl_module.named_children()}

    def get_total_flops(self) -> int:
        return self._counter.get_total_flops()

    def get_flop_counts(self) -> dict[str, dict[Any, int]]:
        counts = self._counter.get_flop_counts()
        named = dict(counts)
        for child, class_name in self._children.items():
            for key, value in counts.items():
                head, _, rest = key.partition(".")
                if head == class_name:
                    path = f"{child}.{rest}" if rest else child
                    named.setdefault(f"{self._prefix}.{path}", value)
        return named


def _is_compiled(pl_module: L.LightningModule) -> bool:
    return any(torch_private.is_compiled(module) for module in pl_module.modules())
