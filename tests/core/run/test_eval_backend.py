"""eval.py's backend keys: a wrong choice or a missing file is refused, naming the key."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from vramkit.core.config.schema import ConfigError
from vramkit.core.run.eval_backend import backend_settings, prepare_model


def _cfg(**keys):
    return OmegaConf.create(keys)


def test_torch_backend_needs_the_checkpoint(tmp_path):
    with pytest.raises(ConfigError, match="ckpt_path: required with backend=torch"):
        backend_settings(_cfg(backend="torch"))
    ckpt = tmp_path / "last.ckpt"
    ckpt.write_bytes(b"")
    assert backend_settings(_cfg(backend="torch", ckpt_path=str(ckpt))).ckpt_path == ckpt


def test_onnxruntime_backend_needs_an_existing_model(tmp_path):
    with pytest.raises(ConfigError, match="onnx_path: required with backend=onnxruntime"):
        backend_settings(_cfg(backend="onnxruntime"))
    with pytest.raises(ConfigError, match="onnx_path: no file at"):
        backend_settings(_cfg(backend="onnxruntime", onnx_path=str(tmp_path / "missing.onnx")))


def test_a_misspelt_backend_names_the_valid_ones(tmp_path):
    with pytest.raises(ConfigError) as error:
        backend_settings(_cfg(backend="onnxrt", onnx_path=str(tmp_path)))
    assert "backend" in str(error.value) and "onnxruntime" in str(error.value)
    assert "conf/eval.yaml" in str(error.value)


def test_a_task_without_an_onnx_backend_is_refused(tmp_path):
    model = tmp_path / "m.onnx"
    model.write_bytes(b"")
    settings = backend_settings(_cfg(backend="onnxruntime", onnx_path=str(model)))
    with pytest.raises(ConfigError, match="not available for task 'sage_distill'"):
        prepare_model(_cfg(task_name="sage_distill"), object(), settings)


def test_the_onnx_backend_node_swaps_the_network(tmp_path):
    model = tmp_path / "m.onnx"
    model.write_bytes(b"")
    settings = backend_settings(_cfg(backend="onnxruntime", onnx_path=str(model), onnx_threads=1))
    cfg = _cfg(onnx_backend={"_target_": f"{__name__}.record_swap"})
    swapped = prepare_model(cfg, {"net": "torch"}, settings)
    assert swapped == {"net": ("onnx", str(model), 1)}


def record_swap(module, *, onnx_path, threads):
    """A stand-in for a task's onnx_backend function."""
    return {**module, "net": ("onnx", str(onnx_path), threads)}


def test_the_torch_backend_loads_the_checkpoint_weights_only(tmp_path):
    trained = torch.nn.Linear(3, 2)
    ckpt = tmp_path / "last.ckpt"
    torch.save({"state_dict": trained.state_dict(), "callbacks": {"Any": {"step": 3}}}, ckpt)
    settings = backend_settings(_cfg(backend="torch", ckpt_path=str(ckpt)))
    model = prepare_model(_cfg(), torch.nn.Linear(3, 2), settings)
    assert torch.equal(model.weight, trained.weight) and torch.equal(model.bias, trained.bias)
    # weights_only: a checkpoint holding an arbitrary object is refused, not unpickled
    torch.save({"state_dict": trained.state_dict(), "payload": Payload()}, ckpt)
    with pytest.raises(
        ConfigError, match=r"^ckpt_path: .*last\.ckpt is refused: loading it would call .*Payload"
    ):
        prepare_model(_cfg(), torch.nn.Linear(3, 2), settings)


class Payload:
    """An object only a full unpickling (code from the file) could rebuild."""
