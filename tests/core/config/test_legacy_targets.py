"""`_target_` paths of vramkit's first layout keep loading: checkpoints, manifests, configs."""

from __future__ import annotations

import importlib
import warnings
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from vramkit.core.config.instantiate import instantiate
from vramkit.core.config.legacy_targets import MOVED_MODULES, current_target, upgrade_targets
from vramkit.tasks.sage.grid_transformer import GridTransformer
from vramkit.tasks.sage.teacher_features.teacher_checkpoint import TEACHER_NETWORK_KEY, load_teacher

OLD_CHECKPOINT = Path(__file__).resolve().parents[2] / "data" / "legacy_layout" / "arc_teacher.ckpt"
OLD_NETWORK = "vramkit.sage.grid_transformer.GridTransformer"


def test_every_new_path_of_the_table_imports():
    for new in MOVED_MODULES.values():
        importlib.import_module(new)


def test_old_paths_become_new_ones_with_a_warning_and_new_paths_stay():
    with pytest.warns(FutureWarning, match="old layout"):
        assert current_target(OLD_NETWORK) == "vramkit.tasks.sage.grid_transformer.GridTransformer"
    with pytest.warns(FutureWarning):  # a moved package: the longest prefix wins
        moved = current_target("vramkit.hardware.planner.errors.PlanningError")
    assert moved == "vramkit.core.planner.errors.PlanningError"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert current_target("vramkit.core.run.train.train") == "vramkit.core.run.train.train"
        assert current_target("torch.optim.AdamW") == "torch.optim.AdamW"


def test_a_module_that_moved_twice_is_followed_to_where_it_is_now(monkeypatch):
    table = {"pkg.old": "pkg.new", "pkg.new.mod": "pkg.new.sub.mod"}
    monkeypatch.setattr("vramkit.core.config.legacy_targets.MOVED_MODULES", table)
    with pytest.warns(FutureWarning, match="it now is pkg.new.sub.mod.Class"):
        assert current_target("pkg.old.mod.Class") == "pkg.new.sub.mod.Class"
    with pytest.warns(FutureWarning):
        assert current_target("pkg.new.mod.Class") == "pkg.new.sub.mod.Class"


def test_nested_nodes_are_upgraded_and_untouched_ones_are_returned_as_they_are():
    node = {"net": {"_target_": OLD_NETWORK, "d_model": 8}, "layers": [{"_target_": "a.B"}]}
    with pytest.warns(FutureWarning):
        upgraded = upgrade_targets(node)
    assert upgraded["net"]["_target_"].startswith("vramkit.tasks.sage.")
    assert upgraded["layers"] is node["layers"]
    assert node["net"]["_target_"] == OLD_NETWORK  # the caller's node is not changed
    fresh = {"_target_": "torch.nn.Identity"}
    assert upgrade_targets(fresh) is fresh


def test_an_old_config_node_still_instantiates():
    node = OmegaConf.create(
        {"_target_": OLD_NETWORK, "d_model": 8, "num_layers": 1, "num_heads": 2, "ffn_dim": 16}
    )
    with pytest.warns(FutureWarning):
        assert isinstance(instantiate(node), GridTransformer)


def test_a_teacher_checkpoint_of_the_old_layout_loads():
    state = torch.load(OLD_CHECKPOINT, map_location="cpu", weights_only=True)
    assert state[TEACHER_NETWORK_KEY]["_target_"] == OLD_NETWORK  # really the old layout's
    with pytest.warns(FutureWarning):
        loaded = load_teacher(OLD_CHECKPOINT)
    assert isinstance(loaded.module, GridTransformer)
    weights = {k.removeprefix("net."): v for k, v in state["state_dict"].items()}
    for name, tensor in loaded.module.state_dict().items():
        assert torch.equal(tensor, weights[name])


def test_a_feature_cache_manifest_network_of_the_old_layout_loads():
    # The student reloads the teacher from its cache manifest's `teacher.network` node.
    state = torch.load(OLD_CHECKPOINT, map_location="cpu", weights_only=True)
    manifest_network = dict(state[TEACHER_NETWORK_KEY])
    with pytest.warns(FutureWarning):
        loaded = load_teacher(OLD_CHECKPOINT, manifest_network, state_dict_prefix="net.")
    assert isinstance(loaded.module, GridTransformer)
