"""The coherence configs: the published weights, and the experiment's six conditions."""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf

pytest.importorskip("transformers", reason="task=text_classification needs `transformers`")

from vramkit.tasks.text_classification.coherence_loss import TERMS, CoherenceSettings

CONF = Path(__file__).resolve().parents[3] / "conf"
PUBLISHED = {"stability": 0.2, "center": 0.1, "separation": 0.05, "brier": 0.1}


def test_the_published_config_holds_the_published_weights_and_momentum(compose_config):
    cfg = compose_config("task=text_classification", "+hw=cpu", "+model/coherence=published")
    settings = CoherenceSettings(**OmegaConf.to_container(cfg.model.coherence))
    assert settings.weights() == PUBLISHED and settings.centroid_momentum == 0.97
    assert settings == CoherenceSettings()
    assert compose_config("task=text_classification", "+hw=cpu").model.coherence is None


@pytest.mark.parametrize("experiment", ["phi15_coherence_tiny", "phi15_coherence"])
def test_each_ablation_removes_exactly_its_term(experiment):
    raw = OmegaConf.load(CONF / "experiment" / f"{experiment}.yaml")

    def coherence(condition: str):
        raw.condition = condition
        return OmegaConf.to_container(raw.model, resolve=True)["coherence"]

    assert coherence("ce_only") is None
    assert {name: coherence("coherence")[name] for name in TERMS} == PUBLISHED
    for term in TERMS:
        ablated = coherence(f"no_{term}")
        assert {n: ablated[n] for n in TERMS} == PUBLISHED | {term: 0.0}
        assert ablated["centroid_momentum"] == 0.97
    # The sweep runs every condition.
    assert raw.hydra.sweeper.params.condition.split(",") == list(raw.coherence_conditions)


def test_a_condition_reaches_the_composed_model(compose_config):
    cfg = compose_config("+hw=cpu", "experiment=phi15_coherence_tiny", "condition=no_center")
    assert cfg.model.coherence.center == 0.0 and cfg.model.coherence.stability == 0.2
