"""The user's path end to end: checkpoint → export (scripts/export.py) → eval.py onnxruntime."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import pytest
import torch

from vramkit.core.config.instantiate import instantiate
from vramkit.core.config.schema import ConfigError
from vramkit.core.run.evaluate import evaluate
from vramkit.tasks.text_detection.export.export_checkpoint import RECORD_NAME, export_checkpoint

TINY = ("+hw=cpu", "debug=smoke")


def _checkpoint(cfg, path: Path) -> Path:
    """A checkpoint of the configured model whose maps hold boxes to compare.

    A fresh head predicts a constant 0.01, and random upsampling kernels a pixel checkerboard:
    neither gives a box. Kernels equal over their 2x2 taps and a spread-out output layer give
    blobs that follow the features."""
    torch.manual_seed(0)
    module = instantiate(cfg.model)
    with torch.no_grad():
        for layer in (module.net.head.prob[3], module.net.head.prob[6]):
            layer.weight.copy_(layer.weight.mean(dim=(2, 3), keepdim=True).expand_as(layer.weight))
        output = module.net.head.prob[6]
        output.weight.mul_(1.0 / output.weight.std())
        output.bias.zero_()
    torch.save(
        {"state_dict": module.state_dict(), "pytorch-lightning_version": L.__version__}, path
    )
    return path


@pytest.mark.slow
def test_export_then_eval_on_onnxruntime_gives_the_torch_numbers_and_files(
    compose_config, tmp_path
):
    ckpt = _checkpoint(compose_config(*TINY, config_name="eval"), tmp_path / "model.ckpt")
    cfg = compose_config(
        *TINY,
        f"ckpt_path={ckpt}",
        "export.exporter=torchscript",  # the dynamo exporter has its own test; this one is slow
        "export.calibration_images=4",
        config_name="export",
    )
    record = export_checkpoint(cfg)
    output = Path(cfg.export.output_dir)
    assert (output / RECORD_NAME).is_file()
    assert {"onnx_fp32", "int8_static", "int8_dynamic"} <= set(record["models"])
    torch_scores, fp32 = record["parity"]["torch"], record["parity"]["onnx_fp32"]
    assert torch_scores["det_care"] > 0  # there are boxes to agree on
    assert record["passed"]["onnx_fp32"]
    for key in ("precision", "recall", "hmean", "matched", "det_care"):
        assert fp32[key] == torch_scores[key]

    results = {}
    for backend, source in (
        ("torch", f"ckpt_path={ckpt}"),
        ("onnxruntime", f"onnx_path={record['models']['onnx_fp32']['path']}"),
    ):
        eval_cfg = compose_config(
            *TINY,
            f"backend={backend}",
            source,
            f"predictions_dir={tmp_path / backend}",
            config_name="eval",
        )
        metrics = evaluate(eval_cfg)
        files = {p.name: p.read_text() for p in sorted((tmp_path / backend).glob("res_*.txt"))}
        results[backend] = (metrics, files)
    assert results["onnxruntime"][0] == results["torch"][0]
    torch_files, onnx_files = results["torch"][1], results["onnxruntime"][1]
    assert torch_files.keys() == onnx_files.keys()
    assert any(text.strip() for text in torch_files.values())
    for name, text in torch_files.items():
        # The same boxes, point for point; scores (mean probability) to float32 rounding.
        expected, got = _rows(text), _rows(onnx_files[name])
        assert [box for box, _ in got] == [box for box, _ in expected], name
        assert [score for _, score in got] == pytest.approx([s for _, s in expected], abs=2e-4)


def _rows(text: str) -> list[tuple[str, float]]:
    """(box coordinates, score) of each line of a submission file with confidences."""
    rows = []
    for line in text.splitlines():
        box, _, score = line.rpartition(",")
        rows.append((box, float(score)))
    return rows


def test_an_unknown_format_or_export_key_is_refused_before_any_work(compose_config, tmp_path):
    ckpt = tmp_path / "model.ckpt"
    ckpt.write_bytes(b"")
    cfg = compose_config(*TINY, f"ckpt_path={ckpt}", "format=tflite", config_name="export")
    with pytest.raises(ConfigError, match="format") as error:
        export_checkpoint(cfg)
    assert "onnx" in str(error.value) and "conf/export.yaml" in str(error.value)
    cfg = compose_config(
        *TINY, f"ckpt_path={ckpt}", "+export.calibraton_images=8", config_name="export"
    )
    with pytest.raises(ConfigError, match=r"export\.calibration_images"):
        export_checkpoint(cfg)
    assert not (tmp_path / "run").exists() or not any((tmp_path / "run").iterdir())
