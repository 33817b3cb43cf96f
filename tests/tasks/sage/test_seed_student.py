"""model=sage_seed is the original 44,101,928-parameter shape; the default student is 512×6."""

from __future__ import annotations

import numpy as np
import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf

from vramkit.tasks.sage.data.arc_batching import collate_grid_items
from vramkit.tasks.sage.data.arc_examples import ArcExample, EncodingSettings, example_item
from vramkit.tasks.sage.seed_student import SageSeedStudent


def _count(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def _net(compose_config, model: str) -> torch.nn.Module:
    cfg = compose_config("task=sage_distill", f"model={model}", "+hw=cpu")
    node = OmegaConf.to_container(cfg.model.net, resolve=True)
    with torch.device("meta"):  # shapes only: no 176 MB of weights to initialise
        return instantiate(node)


def test_seed_config_counts_the_original_parameters_exactly(compose_config):
    net = _net(compose_config, "sage_seed")
    assert isinstance(net, SageSeedStudent)
    assert _count(net) == 44_101_928
    assert net.positions.shape == (6000, 512)
    assert net.input_linear.in_features == 2048
    assert net.decoder[-1].out_features == 30 * 30 * 10


def test_default_student_shape(compose_config):
    net = _net(compose_config, "sage_student")
    assert net.width == 512
    assert len(net.encoder.layers) == 6
    layer = net.encoder.layers[0]
    assert layer.self_attn.num_heads == 8 and layer.linear1.out_features == 2048


def _batch() -> dict[str, torch.Tensor]:
    rng = np.random.default_rng(0)
    grids = [rng.integers(0, 10, (h, w)).astype(np.uint8) for h, w in ((3, 4), (5, 2), (2, 2))]
    example = ArcExample("t/test0", "t", ((grids[0], grids[1]),), grids[2], grids[1])
    return collate_grid_items([example_item(example, EncodingSettings())] * 2)


def test_seed_reads_tokens_and_answers_at_the_query_size():
    torch.manual_seed(0)
    net = SageSeedStudent(
        d_model=32, num_layers=1, num_heads=2, ffn_dim=64, max_positions=64, decoder_dims=(16,)
    )
    batch = _batch()
    output = net(batch)
    assert output.cell_logits.shape == (2, 30, 30, 10) and output.size_logits is None
    assert output.hidden.shape == (2, batch["tokens"].shape[1], 32)
    assert net.predict(batch).size.tolist() == [[2, 2], [2, 2]]
