"""A component without a settings class keeps its defaults in its signature: its YAML node says
``???`` for a key at that default (read through ``${settings_default:…}``), never the value
again."""

from __future__ import annotations

import inspect
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hydra.utils import get_object
from omegaconf import OmegaConf

from vramkit.core.config.component_settings import NODE_KEYS, settings_class_of
from vramkit.core.config.conf_tree import target_nodes

CONF = Path(__file__).resolve().parents[2] / "conf"
GROUPS = ("model", "data", "callbacks", "logger", "trainer")
"""The groups of component nodes: a task's own nodes are not checked here."""

SET_BY_OTHER_CONFIGS = {
    "model/dbnet_r18.yaml": {"net.backbone_width", "net.inner_channels"},  # dbnet_lite, _tiny
    "model/causal_lm.yaml": {"config_overrides", "finetune"},  # causal_lm_tiny, llm_*_tiny
    "model/phi15.yaml": {"gradient_checkpointing", "lora", "coherence"},  # model/lora, coherence
    "model/sage_student.yaml": {  # experiment=sage_small
        "changed_weight",
        "net.copy_prior",
        "net.d_model",
        "net.decoder_layers",
        "net.ffn_dim",
        "net.num_heads",
        "net.num_layers",
    },
}
"""Keys at their signature's default that a later shipped config sets. OmegaConf reads the
value of a key that a later config merges over (omegaconf/basecontainer.py, ``_map_merge``:
``dest_node._maybe_dereference_node()``), so a ``${settings_default:…}`` there would import the
component (torch, transformers) while the config is composed: these keep their value."""


def repeated_signature_defaults(file: Path) -> list[str]:
    """``path.key: value`` for each plain value of a vramkit component (one without a settings
    class) that its signature's default says again."""
    found = []
    for path, node in target_nodes(yaml.safe_load(file.read_text()) or {}):
        target = node["_target_"]
        if not target.startswith("vramkit.") or settings_class_of(target) is not None:
            continue
        parameters = inspect.signature(get_object(target)).parameters
        for key, value in node.items():
            parameter = parameters.get(key)
            if key in NODE_KEYS or parameter is None or isinstance(value, dict | list):
                continue
            default = parameter.default
            at_default = type(value) is type(default) and value == default
            if default is not inspect.Parameter.empty and at_default:
                found.append(f"{'.'.join((*path, key))}: {value!r}")
    return found


def _allowed(file: Path, repeated: str) -> bool:
    key = repeated.split(":")[0]
    return key in SET_BY_OTHER_CONFIGS.get(file.relative_to(CONF).as_posix(), ())


TASKS = sorted(file.stem for file in (CONF / "task").glob("*.yaml"))
FILES = sorted(file for group in GROUPS for file in (CONF / group).rglob("*.yaml"))


@pytest.mark.parametrize("file", FILES, ids=lambda f: str(f.relative_to(CONF)))
def test_no_node_writes_its_components_signature_default(file):
    repeated = [r for r in repeated_signature_defaults(file) if not _allowed(file, r)]
    assert repeated == [], "write ??? for these keys"


def test_keys_other_configs_set_are_still_at_the_signatures_default():
    # a key that left the list (its value changed, or the later config no longer sets it)
    # leaves SET_BY_OTHER_CONFIGS too
    for name, keys in SET_BY_OTHER_CONFIGS.items():
        repeated = {r.split(":")[0] for r in repeated_signature_defaults(CONF / name)}
        assert keys <= repeated, name


def test_composing_a_task_imports_no_component():
    # what a class default read while merging would cost: torch (and transformers) at compose
    script = (
        "import sys\n"
        "from vramkit.core.run.settling.compose import compose_config\n"
        f"for task in {TASKS!r}:\n"
        "    compose_config('train', ['+hw=cpu', f'task={task}'])\n"
        "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('vramkit.tasks')))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=CONF.parent, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_the_finder_sees_a_repeated_signature_default(tmp_path):
    file = tmp_path / "net.yaml"
    file.write_text(
        "_target_: vramkit.tasks.text_detection.network.loss.DBLoss\n"
        "prob_weight: 5.0  # the signature's default again\n"
        "binary_weight: ???  # read from the signature\n"
        "thresh_weight: 2.0  # another value\n"
    )
    assert repeated_signature_defaults(file) == ["prob_weight: 5.0"]


def test_a_question_mark_composes_the_signature_default(compose_config):
    cfg = compose_config("+hw=cpu", "model=dbnet_r18")
    raw = OmegaConf.to_container(cfg.model.loss, resolve=False)
    loss = "vramkit.tasks.text_detection.network.loss.DBLoss"
    assert raw["prob_weight"] == f"${{settings_default:{loss},prob_weight}}"
    assert cfg.model.loss.prob_weight == 5.0 and cfg.model.loss.pool_over_processes is True
    assert cfg.model.net.backbone_weights is None and cfg.model.net.inner_channels == 256
