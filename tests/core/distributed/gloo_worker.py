"""One of two gloo processes for test_process_group_sums.py.

``python gloo_worker.py RANK PORT OUT_DIR``: each process takes its half of one global batch,
runs the synchronised pieces (BatchNorm, DBNet's pooled loss, the sampler's share) on it, and
writes ``OUT_DIR/rank<RANK>.json`` with the largest differences from one process computing the
same on the whole batch (which every process can do locally: the references use no collective).
"""

from __future__ import annotations

import json
import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from vramkit.core.data.resumable_loader import EpochOrder
from vramkit.core.distributed.sync_batchnorm import convert_batchnorm
from vramkit.tasks.text_detection.network.loss import DBLoss

WORLD = 2
BATCH = 6  # global batch; each process gets 3


def _batch() -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(3)
    images = torch.randn(BATCH, 3, 8, 8, generator=generator) * 2 + 1
    images[:, :, :4] = 0  # black padding, as augmentation makes it: many tied pixel losses
    shape = (BATCH, 8, 8)
    maps = {
        "shrink_map": (torch.rand(shape, generator=generator) > 0.8).float(),
        "shrink_mask": (torch.rand(shape, generator=generator) > 0.1).float(),
        "thresh_map": torch.rand(shape, generator=generator),
        "thresh_mask": (torch.rand(shape, generator=generator) > 0.5).float(),
    }
    return images, maps


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.norm = nn.BatchNorm2d(4)
        self.head = nn.Conv2d(4, 3, 1)

    def forward(self, images: torch.Tensor) -> dict[str, torch.Tensor]:
        maps = self.head(torch.relu(self.norm(self.conv(images))))
        return {
            "prob_logits": maps[:, 0],
            "thresh": maps[:, 1].sigmoid(),
            "binary_logits": maps[:, 2],
        }


def _step(net: nn.Module, images: torch.Tensor, maps: dict, loss: DBLoss) -> torch.Tensor:
    net.zero_grad()
    value = loss(net(images), maps)["loss"]
    value.backward()
    return value.detach()


def main(rank: int, port: int, out_dir: Path) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=WORLD,
        timeout=timedelta(seconds=30),
    )
    images, maps = _batch()
    half = slice(rank * BATCH // WORLD, (rank + 1) * BATCH // WORLD)

    reference = _Net()
    expected_loss = _step(reference, images, maps, DBLoss(pool_over_processes=False))

    synced = convert_batchnorm(_Net())
    loss = _step(synced, images[half], {k: v[half] for k, v in maps.items()}, DBLoss())
    for parameter in synced.parameters():  # what DDP does to the gradients
        dist.all_reduce(parameter.grad)
        parameter.grad /= WORLD
    differences = {
        "loss": (loss - expected_loss).abs().item(),
        "grads": max(
            (a.grad - b.grad).abs().max().item()
            for a, b in zip(synced.parameters(), reference.parameters(), strict=True)
        ),
        "running_mean": (synced.norm.running_mean - reference.norm.running_mean).abs().max().item(),
        "running_var": (synced.norm.running_var - reference.norm.running_var).abs().max().item(),
    }
    order = EpochOrder(10, seed=5)
    order.set_epoch(2)
    result = {
        "differences": differences,
        "synced_type": type(synced.norm).__name__,
        "share": [key.index for key in order],
        "seeds": [key.seed for key in order],
        "full_order": EpochOrder(10, seed=5, num_replicas=1, rank=0).order(2),
    }
    (out_dir / f"rank{rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3]))
