"""Synchronised BatchNorm that also runs on the CPU, so ``trainer=ddp_sim`` (processes talking over
gloo) normalises over the global batch as ``trainer=ddp`` does on GPUs.

``torch.nn.SyncBatchNorm`` refuses CPU tensors in training ("SyncBatchNorm expected input tensor
to be on GPU", ``torch/nn/modules/batchnorm.py``, ``SyncBatchNorm.forward``), and Lightning's
``sync_batchnorm=True`` converts to exactly that layer (``lightning/pytorch/plugins/layer_sync.py``,
``TorchSyncBatchNorm``). :class:`ProcessGroupBatchNorm`, for CPU processes, computes the
statistics from sums over the processes, two-pass as
CPU ``batch_norm`` does (mean first, then the mean squared deviation from it), so the result
differs from one process normalising the whole batch by float summation order only.
"""

from __future__ import annotations

from typing import Any

import torch
from lightning.pytorch.plugins.layer_sync import LayerSync
from torch import Tensor, nn

from vramkit.core.compat import torch_private
from vramkit.core.distributed.process_sums import process_count, sum_over_processes


class ProcessGroupBatchNorm(torch_private.BatchNormBase):
    """BatchNorm whose training statistics span every process of the default group (CPU/gloo).

    Not an ``nn.SyncBatchNorm``: DDP refuses to wrap a CPU module holding one ("SyncBatchNorm
    layers only work with GPU modules", ``_passing_sync_batchnorm_handle`` in
    ``torch/nn/parallel/distributed.py``). ``original`` is the class it replaced, which
    :func:`revert_batchnorm` restores.
    """

    original: type[torch_private.BatchNormBase] = nn.BatchNorm2d

    def _check_input_dim(self, input: Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")

    def forward(self, input: Tensor) -> Tensor:
        """Normalise ``input`` (N, C, ...) with statistics of every process's batch in training."""
        if not self.training or process_count() == 1:
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
    return _swap_batchnorm(module, to_synced=True)


def revert_batchnorm(module: nn.Module) -> nn.Module:
    """The inverse of :func:`convert_batchnorm`: each layer becomes its original class again."""
    return _swap_batchnorm(module, to_synced=False)


def _swap_batchnorm(module: nn.Module, *, to_synced: bool) -> nn.Module:
    converted = module
    if to_synced:
        swap = isinstance(module, torch_private.BatchNormBase) and not isinstance(
            module, ProcessGroupBatchNorm
        )
    else:
        swap = isinstance(module, ProcessGroupBatchNorm)
    if swap:
        target = ProcessGroupBatchNorm if to_synced else module.original
        converted = target(
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
        if to_synced:
            converted.original = type(module)
    for name, child in module.named_children():
        converted.add_module(name, _swap_batchnorm(child, to_synced=to_synced))
    return converted


class CpuSyncBatchNorm(LayerSync):
    """Lightning's layer-sync plugin (``lightning/pytorch/plugins/layer_sync.py``) for
    :class:`ProcessGroupBatchNorm`."""

    def apply(self, model: nn.Module) -> nn.Module:
        """Every BatchNorm layer of ``model`` synchronised over the processes."""
        return convert_batchnorm(model)

    def revert(self, model: nn.Module) -> nn.Module:
        """Every synchronised layer of ``model`` back to its original BatchNorm class."""
        return revert_batchnorm(model)


def needs_cpu_sync_batchnorm(trainer: Any) -> bool:
    """Whether the resolved trainer config (a mapping) asks for synchronised BatchNorm on the
    CPU, where torch's layer refuses to run and :class:`CpuSyncBatchNorm` stands in."""
    return bool(trainer.get("sync_batchnorm")) and trainer.get("accelerator") == "cpu"


def cpu_sync_batchnorm_arguments(plugins: list[Any]) -> dict[str, Any]:
    """Trainer arguments that give a CPU run of several processes its synchronised BatchNorm,
    ``plugins`` being the trainer config's instantiated ones: Lightning's flag turned off
    (Lightning refuses the flag beside another layer-sync plugin, ``accelerator_connector.py``)
    and :class:`CpuSyncBatchNorm` joined to the plugins."""
    return {"sync_batchnorm": False, "plugins": [*plugins, CpuSyncBatchNorm()]}
