"""The coherence loss: every term trains the model, has its minimum where it should, no offset."""

from __future__ import annotations

import math

import pytest
import torch

pytest.importorskip("transformers", reason="task=text_classification needs `transformers`")

from vramkit.core.config.schema import ConfigError
from vramkit.tasks.text_classification.coherence_loss import (
    TERMS,
    CoherenceLoss,
    CoherenceSettings,
    center_term,
    separation_term,
    stability_term,
)
from vramkit.tasks.text_classification.module import TextClassificationModule

NUM_LABELS = 3
HF_CONFIG = {
    "model_type": "phi",
    "vocab_size": 32,
    "hidden_size": 16,
    "intermediate_size": 32,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "resid_pdrop": 0.2,  # dropout on: the stability term must see through it
    "embd_pdrop": 0.2,
}


def _module(checkpointing: bool = False, **weights: float) -> TextClassificationModule:
    coherence = {name: 0.0 for name in TERMS} | weights
    module = TextClassificationModule(
        num_labels=NUM_LABELS,
        pad_token_id=0,
        optimizer=torch.optim.SGD,
        hf_config=HF_CONFIG,
        coherence=coherence,
        gradient_checkpointing=checkpointing,
    )
    return module.train()


def _batch() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(1, 32, (6, 7), generator=generator)
    input_ids[:2, 5:] = 0  # padding: the pooled token is not always the last
    return {
        "input_ids": input_ids,
        "attention_mask": (input_ids != 0).long(),
        "labels": torch.tensor([0, 1, 2, 0, 1, 2]),
    }


@pytest.mark.parametrize("term", TERMS)
def test_each_term_alone_puts_gradient_on_the_transformer(term):
    torch.manual_seed(0)
    module = _module(**{term: 1.0})
    _, _, terms = module._coherent_training_loss(_batch(), module.coherence)
    assert set(terms) == {"ce", term}
    terms[term].backward()
    layer = module.model.model.layers[0]  # below the head: the features themselves move
    grads = [p.grad for p in layer.parameters() if p.grad is not None]
    assert grads and sum(float(g.abs().sum()) for g in grads) > 0
    assert module.model.model.embed_tokens.weight.grad.abs().sum() > 0


CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.parametrize("checkpointing", [False, True])
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=CUDA)])
def test_the_noisy_forward_replays_the_clean_forwards_dropout_masks(device, checkpointing):
    torch.manual_seed(0)
    module = _module(checkpointing, stability=1.0).to(device)
    module.noisy_forward.relative_std = 1e-7  # noise ~0: only a different mask could differ
    batch = {name: tensor.to(device) for name, tensor in _batch().items()}
    loss, _, terms = module._coherent_training_loss(batch, module.coherence)
    loss.backward()  # under checkpointing, the recomputation replays the masks too
    # Two independent dropout draws of the same model: what a stability term without a shared
    # mask measures (the brief's defect).
    with torch.no_grad():
        first = module(batch["input_ids"], batch["attention_mask"])
        second = module(batch["input_ids"], batch["attention_mask"])
    unshared = float(stability_term(first, second))
    assert unshared > 1e-4
    assert float(terms["stability"]) < unshared * 1e-6


def test_the_stability_term_grows_with_the_noise_and_is_zero_without_it():
    logits = torch.randn(4, 3)
    assert float(stability_term(logits, logits.clone())) == 0.0
    torch.manual_seed(0)
    module = _module(stability=1.0)
    values = []
    for std in (0.01, 0.3):
        module.noisy_forward.relative_std = std
        torch.manual_seed(1)
        values.append(
            float(module._coherent_training_loss(_batch(), module.coherence)[2]["stability"])
        )
    assert 0 < values[0] < values[1]


def test_center_is_zero_on_the_centroids_and_descends_to_them():
    centroids = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
    labels = torch.tensor([0, 1, 1])
    assert float(center_term(centroids[labels], labels, centroids)) == 0.0
    features = torch.randn(3, 2, requires_grad=True)
    optimizer = torch.optim.SGD([features], lr=0.5)
    for _ in range(100):
        optimizer.zero_grad()
        center_term(features, labels, centroids).backward()
        optimizer.step()
    assert float(center_term(features, labels, centroids)) < 1e-6


def test_separation_has_no_offset_and_is_one_for_coinciding_classes():
    labels = torch.tensor([0, 1, 2, 0])
    far = torch.tensor([[30.0, 0.0], [0.0, 30.0], [-30.0, -30.0], [30.0, 0.0]])
    assert float(separation_term(far, labels, 3)) < 1e-12  # no C·(e−1) or diagonal offset
    same = torch.ones(4, 2)
    assert float(separation_term(same, labels, 3)) == pytest.approx(1.0)
    # Two classes 2 apart in 2 dimensions: exp(-4 / 2), both ordered pairs alike.
    two = torch.tensor([[0.0, 0.0], [2.0, 0.0]])
    assert float(separation_term(two, torch.tensor([0, 1]), 3)) == pytest.approx(math.exp(-2))
    one_class = torch.randn(3, 2, requires_grad=True)
    assert float(separation_term(one_class, torch.tensor([1, 1, 1]), 3)) == 0.0


def test_separation_descends_by_moving_the_class_means_apart():
    labels = torch.tensor([0, 1, 2, 0, 1, 2])
    features = (0.01 * torch.randn(6, 4)).requires_grad_()
    optimizer = torch.optim.SGD([features], lr=2.0)
    start = float(separation_term(features, labels, 3))
    for _ in range(200):
        optimizer.zero_grad()
        separation_term(features, labels, 3).backward()
        optimizer.step()
    assert start > 0.9 and float(separation_term(features, labels, 3)) < 0.05


def test_brier_is_zero_for_confident_right_answers_and_two_for_confident_wrong_ones():
    loss = CoherenceLoss(
        CoherenceSettings(stability=0.0, center=0.0, separation=0.0, brier=1.0),
        num_classes=2,
        feature_dim=1,
    )
    labels = torch.tensor([0, 1])
    features = torch.zeros(2, 1)
    right = torch.tensor([[50.0, -50.0], [-50.0, 50.0]])
    assert float(loss(right, features, labels)["brier"]) == pytest.approx(0.0, abs=1e-12)
    assert float(loss(-right, features, labels)["brier"]) == pytest.approx(2.0)
    # Uniform over 2 classes: (0.5)² + (0.5)² per sample.
    assert float(loss(torch.zeros(2, 2), features, labels)["brier"]) == pytest.approx(0.5)


def test_centroids_start_at_the_first_class_mean_then_follow_the_ema():
    loss = CoherenceLoss(CoherenceSettings(), num_classes=2, feature_dim=1)
    loss.update_centroids(torch.tensor([[2.0], [4.0]]), torch.tensor([0, 0]))
    assert loss.centroids.tolist() == [[3.0], [0.0]]  # class 1 unseen: untouched
    loss.update_centroids(torch.tensor([[13.0], [7.0]]), torch.tensor([0, 1]))
    assert loss.centroids[0].item() == pytest.approx(0.97 * 3 + 0.03 * 13)
    assert loss.centroids[1].item() == 7.0
    assert loss.centroid_seen.tolist() == [True, True]


def test_the_total_is_the_weighted_sum_of_the_logged_terms():
    torch.manual_seed(0)
    module = _module(stability=0.2, center=0.1, separation=0.05, brier=0.1)
    loss, _, terms = module._coherent_training_loss(_batch(), module.coherence)
    weighted = sum(w * terms[n] for n, w in module.coherence.settings.weights().items())
    assert float(loss) == pytest.approx(float(terms["ce"] + weighted), rel=1e-6)


def test_a_misspelt_weight_is_refused_naming_the_key_and_the_closest():
    with pytest.raises(
        ConfigError, match=r"model\.coherence\.stabilty.*model\.coherence\.stability"
    ):
        _module(stabilty=0.2)
    with pytest.raises(ConfigError, match=r"model\.coherence\.centroid_momentum"):
        _module(centroid_momentum=1.0)


def test_activation_checkpointing_is_turned_on_without_transformers_deprecation_warning():
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = _module(checkpointing=True)
    assert module.model.model.gradient_checkpointing  # on, through the non-deprecated switch
    deprecated = [w for w in caught if "gradient_checkpointing_enable" in str(w.message)]
    assert deprecated == []
