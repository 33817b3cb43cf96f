"""`evaluate(cfg)` asks for the inference plan of the network it runs: PyTorch's, not an
onnxruntime export's (which runs on the CPU)."""

from __future__ import annotations

import pytest

from vramkit.core.run import evaluate as evaluate_module


class _Settled(Exception):
    """Stops `evaluate` once its profile is asked for: the rest is the run."""


@pytest.mark.parametrize("backend", ["torch", "onnxruntime"])
def test_only_the_torch_backend_plans_the_eval_batch(
    backend, compose_config, tmp_path, monkeypatch
):
    model = tmp_path / ("model.onnx" if backend == "onnxruntime" else "last.ckpt")
    model.write_bytes(b"")  # the backend's file exists; the checkpoint's contract is not run
    key = "onnx_path" if backend == "onnxruntime" else "ckpt_path"
    keys = [f"{key}={model}"]
    cfg = compose_config("+hw=cpu", f"backend={backend}", *keys, config_name="eval")
    asked: dict = {}

    def settle(cfg, **options):
        asked.update(options)
        raise _Settled

    monkeypatch.setattr(evaluate_module, "check_resume", lambda cfg: None)
    monkeypatch.setattr(evaluate_module, "settle", settle)
    with pytest.raises(_Settled):
        evaluate_module.evaluate(cfg)
    assert asked["plan_batches"] is False
    assert asked["plan_inference"] is (backend == "torch")
