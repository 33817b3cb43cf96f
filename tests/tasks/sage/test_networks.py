"""The grid transformer: output shapes, padding invariance, and the copy prior."""

from __future__ import annotations

import numpy as np
import torch

from vramkit.tasks.sage.data.arc_batching import collate_grid_items
from vramkit.tasks.sage.data.arc_examples import ArcExample, EncodingSettings, example_item
from vramkit.tasks.sage.grid_transformer import GridTransformer
from vramkit.tasks.sage.grids.grid_outputs import copy_prediction

RNG = np.random.default_rng(0)


def _example(query_shape: tuple[int, int], demos: int) -> ArcExample:
    def grid(h: int, w: int) -> np.ndarray:
        return RNG.integers(0, 10, (h, w)).astype(np.uint8)

    pairs = tuple((grid(3, 4), grid(4, 3)) for _ in range(demos))
    return ArcExample("t/test0", "t", pairs, grid(*query_shape), grid(2, 2))


def _net(**kwargs) -> GridTransformer:
    torch.manual_seed(0)
    options = {"d_model": 16, "num_layers": 2, "num_heads": 2, "ffn_dim": 32, **kwargs}
    return GridTransformer(**options).eval()


def test_outputs_do_not_depend_on_batch_padding():
    short, long = _example((2, 3), demos=0), _example((6, 7), demos=3)
    settings = EncodingSettings()
    net = _net(decoder_layers=1)
    alone = collate_grid_items([example_item(short, settings)])
    padded = collate_grid_items([example_item(short, settings), example_item(long, settings)])
    assert padded["tokens"].shape[1] > alone["tokens"].shape[1]
    with torch.no_grad():
        a, b = net(alone), net(padded)
    length = alone["tokens"].shape[1]
    torch.testing.assert_close(a.cell_logits[0], b.cell_logits[0], atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(a.size_logits[0], b.size_logits[0], atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(a.hidden[0], b.hidden[0, :length], atol=1e-5, rtol=1e-4)


def test_shapes():
    batch = collate_grid_items([example_item(_example((5, 5), demos=2), EncodingSettings())] * 3)
    output = _net()(batch)
    assert output.cell_logits.shape == (3, 30, 30, 10)
    assert output.size_logits.shape == (3, 2, 30)
    assert output.hidden.shape == (3, batch["tokens"].shape[1], 16)


def test_a_strong_copy_prior_starts_at_the_copy_baseline():
    items = [
        example_item(_example(shape, demos=1), EncodingSettings()) for shape in ((3, 5), (7, 2))
    ]
    batch = collate_grid_items(items)
    with torch.no_grad():
        prediction = _net(copy_prior=50.0).predict(batch)
        neutral = _net(copy_prior=0.0).predict(batch)
    baseline = copy_prediction(batch["query_grid"])
    assert torch.equal(prediction.cells, baseline.cells)
    assert torch.equal(prediction.size, baseline.size)
    assert not torch.equal(neutral.cells, baseline.cells)


def test_encode_and_predict_matches_the_separate_calls():
    batch = collate_grid_items([example_item(_example((4, 4), demos=1), EncodingSettings())] * 2)
    net = _net(decoder_layers=1)
    with torch.no_grad():
        features, prediction = net.encode_and_predict(batch)
        torch.testing.assert_close(features, net.encode_inputs(batch))
        separate = net.predict(batch)
    assert torch.equal(prediction.cells, separate.cells)
    assert torch.equal(prediction.size, separate.size)
