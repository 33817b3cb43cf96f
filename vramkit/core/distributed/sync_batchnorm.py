"""Synchronised BatchNorm that also runs on the CPU, so ``trainer=ddp_sim`` (processes talking over
gloo) normalises over the global batch as ``trainer=ddp`` does on GPUs.

``torch.nn.SyncBatchNorm`` refuses CPU tensors in training ("SyncBatchNorm expected input tensor
to be on GPU", ``torch/nn/modules/batchnorm.py``, ``SyncBatchNorm.forward``), and Lightning's
``sync_batchnorm=True`` converts to exactly that layer (``lightning/pytorch/plugins/layer_sync.py``,
``TorchSyncBatchNorm``). :class:`ProcessGroupBatchNorm` keeps torch's layer for accelerator
inputs and, for CPU inputs, computes the statistics from sums over the processes, two-pass as
CPU ``batch_norm`` does (mean first, then the mean squared deviation from it), so the result
differs from one process normalising the whole batch by float summation order only.
"""

from __future__ import annotations

from typing import Any

import torch
from lightning.pytorch.plugins.layer_sync import TorchSyncBatchNorm
from torch import Tensor, nn

from vramkit.core.distributed.process_sums import process_count, sum_over_processes


class ProcessGroupBatchNorm(nn.SyncBatchNorm):
    """``nn.SyncBatchNorm`` whose CPU path synchronises over gloo instead of refusing."""

    def forward(self, input: Tensor) -> Tensor:
        """Normalise ``input`` (N, C, ...) with statistics of every process's batch in training."""
        if input.device.type != "cpu" or not self.training or process_count() == 1:
            return super().forward(input)
        self._check_input_dim(input)
        factor = self._average_factor()
        dims = [0, *range(2, input.dim())]
        shape = [1, input.size(1)] + [1] * (input.dim() - 2)
        count = input.new_tensor([input.numel() / input.size(1)])
        totals = sum_over_processes(torch.cat([input.sum(dims), count]))
        samples = totals[-1]
        mean = totals[:-1] / samples
        centred = input - mean.view(shape)
        var = sum_over_processes((centred * centred).sum(dims)) / samples  # biased, as BN uses
        output = centred * torch.rsqrt(var + self.eps).view(shape)
        if self.weight is not None:
            output = output * self.weight.view(shape) + self.bias.view(shape)
        if self.track_running_stats and self.running_mean is not None:
            with torch.no_grad():  # running variance is unbiased, as F.batch_norm keeps it
                unbiased = var.detach() * samples / max(float(samples) - 1.0, 1.0)
                self.running_mean.lerp_(mean.detach(), factor)
                self.running_var.lerp_(unbiased, factor)
        return output

    def _average_factor(self) -> float:
        # Same bookkeeping as torch's BatchNorm forward: count the batch, then pick the factor.
        if not self.track_running_stats or self.num_batches_tracked is None:
            return 0.0 if self.momentum is None else self.momentum
        self.num_batches_tracked.add_(1)
        if self.momentum is None:  # cumulative moving average
            return 1.0 / float(self.num_batches_tracked)
        return self.momentum


def convert_batchnorm(module: nn.Module) -> nn.Module:
    """``module`` with every BatchNorm layer replaced by a :class:`ProcessGroupBatchNorm` that
    shares its parameters and buffers (torch's ``convert_sync_batchnorm``, with this class)."""
    converted = module
    if isinstance(module, nn.modules.batchnorm._BatchNorm) and not isinstance(
        module, ProcessGroupBatchNorm
    ):
        converted = ProcessGroupBatchNorm(
            module.num_features,
            module.eps,
            module.momentum,
            module.affine,
            module.track_running_stats,
        )
        if module.affine:
            converted.weight = module.weight
            converted.bias = module.bias
        converted.running_mean = module.running_mean
        converted.running_var = module.running_var
        converted.num_batches_tracked = module.num_batches_tracked
        converted.train(module.training)
    for name, child in module.named_children():
        converted.add_module(name, convert_batchnorm(child))
    return converted


class CpuSyncBatchNorm(TorchSyncBatchNorm):
    """Lightning's layer-sync plugin, converting to :class:`ProcessGroupBatchNorm`.

    ``revert`` is Lightning's own: it recognises the layers as ``nn.SyncBatchNorm``.
    """

    def apply(self, model: nn.Module) -> nn.Module:
        """Every BatchNorm layer of ``model`` synchronised over the processes."""
        return convert_batchnorm(model)


def cpu_sync_batchnorm_arguments(trainer: Any, plugins: list[Any]) -> dict[str, Any]:
    """Trainer arguments that give a CPU run of several processes its synchronised BatchNorm.

    ``trainer`` is the resolved trainer config (a mapping), ``plugins`` its instantiated
    ``plugins``. Empty unless ``sync_batchnorm`` is on and the accelerator is the CPU: then
    Lightning's flag is turned off (Lightning refuses the flag beside another layer-sync
    plugin, ``accelerator_connector.py``) and :class:`CpuSyncBatchNorm` joins the plugins.
    """
    if not trainer.get("sync_batchnorm") or trainer.get("accelerator") != "cpu":
        return {}
    return {"sync_batchnorm": False, "plugins": [*plugins, CpuSyncBatchNorm()]}
