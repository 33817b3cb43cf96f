"""append_overrides changes a composed config as the same overrides typed after the command."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf, open_dict

from vramkit.core.run.append_overrides import OverrideError, append_overrides
from vramkit.core.run.compose import CONF_DIR, compose_config, forget_composition
from vramkit.core.run.resolvers import register_resolvers

COMMAND = ["+hw=cpu", "task=text_classification", "hw.batch_size=8"]


@pytest.fixture
def hydra_run(tmp_path) -> Iterator[None]:
    """A Hydra run in progress, as inside `@hydra.main`: global Hydra and its run config set."""
    register_resolvers()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        run = compose("train", overrides=COMMAND, return_hydra_config=True)
        HydraConfig.instance().set_config(run)
        yield
    forget_composition()


def _composed(*extra: str):
    cfg = compose("train", overrides=[*COMMAND, *extra])
    return OmegaConf.to_container(cfg, resolve=False)


def test_key_value_overrides_equal_typing_them(hydra_run):
    extra = ("model.gradient_checkpointing=true", "hw.batch_size=2", "hw.accumulate_grad_batches=4")
    cfg = compose("train", overrides=COMMAND)
    append_overrides(cfg, extra, conf_dir=CONF_DIR)
    assert OmegaConf.to_container(cfg, resolve=False) == _composed(*extra)


def test_a_config_group_choice_composes_again(hydra_run):
    cfg = compose("train", overrides=COMMAND)
    append_overrides(cfg, ["trainer=ddp_sim"], conf_dir=CONF_DIR)
    assert OmegaConf.to_container(cfg, resolve=False) == _composed("trainer=ddp_sim")
    assert cfg.trainer.strategy == "ddp"  # ddp_sim's; the default trainer has none


def test_a_group_choice_outside_a_hydra_run_is_refused(tmp_path):
    register_resolvers()
    cfg = compose_config("train", COMMAND, output_dir=tmp_path)
    forget_composition()
    with pytest.raises(OverrideError, match="trainer=ddp_sim"):
        append_overrides(cfg, ["trainer=ddp_sim"], conf_dir=CONF_DIR)
    with open_dict(cfg):
        append_overrides(cfg, ["hw.batch_size=3"], conf_dir=CONF_DIR)
    assert cfg.hw.batch_size == 3
