"""The config's resolvers: none of them plans; the profile's values are plain `${hw.…}`."""

from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf

from vramkit.core.config import conf_tree
from vramkit.core.run.settling import resolvers
from vramkit.core.run.settling.compose import REPO_ROOT


def test_composition_reads_the_profile_as_given_and_plans_nothing(compose_config):
    # `--cfg job --resolve` shows this: the user's config, "auto" batch sizes and all; the run's
    # values come from settling it (vramkit.core.run.settling.settle, plan_memory.py
    # --print-config).
    values = OmegaConf.to_container(compose_config("+hw=t4", "debug=smoke"), resolve=True)
    assert (values["data"]["batch_size"], values["data"]["val_batch_size"]) == ("auto", "auto")
    assert values["data"]["num_workers"] == 0  # debug=smoke's, over the profile's 2
    assert values["trainer"]["precision"] == "16-mixed"


def test_project_root_is_the_repository_unless_the_environment_moves_it(monkeypatch, tmp_path):
    monkeypatch.delenv("PROJECT_ROOT", raising=False)
    assert Path(resolvers.project_root()) == REPO_ROOT
    assert (REPO_ROOT / "conf" / "train.yaml").is_file()
    monkeypatch.setenv("PROJECT_ROOT", str(tmp_path))
    assert resolvers.project_root() == str(tmp_path)


def test_configs_and_corpora_are_the_packages_files_in_a_wheel_else_the_checkouts(
    monkeypatch, tmp_path
):
    assert resolvers.CONF_DIR == REPO_ROOT / "conf"  # a checkout: no vramkit/conf link needed
    assert resolvers.CORPORA_DIR == REPO_ROOT / "corpora"
    (tmp_path / "corpora").mkdir()  # an installed wheel's vramkit/corpora
    monkeypatch.setattr(conf_tree, "PACKAGE_DIR", tmp_path)  # where shipped_folder looks
    assert conf_tree.shipped_folder("corpora") == tmp_path / "corpora"
    assert conf_tree.shipped_folder("conf") == REPO_ROOT / "conf"


def test_the_topic_sentences_come_from_the_shipped_corpora(compose_config):
    cfg = compose_config("+hw=cpu", "experiment=phi15_coherence_tiny")
    tokenizer = Path(cfg.data.tokenizer_dir)
    assert tokenizer == resolvers.CORPORA_DIR / "topic_sentences" / "tokenizer"
    assert (tokenizer / "tokenizer.json").is_file()
