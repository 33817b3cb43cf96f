"""int8 DBNet with onnxruntime: static QDQ (calibrated on training images) and dynamic.

Static quantisation (``quantize_static``, QDQ format) stores int8 weights per output channel and
uint8 activations whose ranges come from running the float model on calibration images; on CPU
onnxruntime then fuses each QuantizeLinear/DequantizeLinear pair around a Conv into an integer
convolution (https://onnxruntime.ai/docs/performance/model-optimizations/quantization.html).
Dynamic quantisation needs no calibration: weights are int8, activation ranges are measured on
every run; it is the simple option, mostly meant for MatMul-heavy models.

The float model is first pre-processed (``quant_pre_process``: shape inference and graph
optimisation that folds BatchNorm into Conv), as that page recommends, so the quantised graph
holds one Conv per BatchNorm-folded convolution.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from vramkit.tasks.text_detection.export.onnx_export import INPUT_NAME

CALIBRATION_METHODS = ("minmax", "entropy", "percentile")
"""How activation ranges are taken from the calibration images (onnxruntime's CalibrationMethod)."""


def preprocess_for_quantization(fp32_path: str | Path, out_path: str | Path) -> Path:
    """``fp32_path`` with shapes inferred and BatchNorm folded, written to ``out_path``."""
    from onnxruntime.quantization.shape_inference import quant_pre_process

    out_path = Path(out_path)
    # Symbolic shape inference only helps transformer-style graphs; it chokes on torch.export's
    # derived dims ("32*height_div32") and is not needed for convolutions.
    quant_pre_process(str(fp32_path), str(out_path), skip_symbolic_shape=True)
    return out_path


class ImageCalibrationReader:
    """onnxruntime's calibration data reader over an iterable of (B, 3, H, W) float32 arrays."""

    def __init__(self, batches: Iterable[np.ndarray]) -> None:
        self._batches: Iterator[np.ndarray] = iter(batches)

    def get_next(self) -> dict[str, np.ndarray] | None:
        batch = next(self._batches, None)
        if batch is None:
            return None
        return {INPUT_NAME: np.ascontiguousarray(batch, dtype=np.float32)}

    def rewind(self) -> None:  # onnxruntime calls it between calibration passes on some methods
        raise RuntimeError("calibration batches are read once; build a new reader")


def quantize_static_qdq(
    fp32_path: str | Path,
    out_path: str | Path,
    calibration: Iterable[np.ndarray],
    *,
    method: str = "minmax",
    per_channel: bool = True,
    fp32_nodes: Sequence[str] = (),
) -> dict[str, Any]:
    """Static int8 QDQ model of ``fp32_path`` at ``out_path``, calibrated on ``calibration``.

    ``calibration`` yields normalised (B, 3, H, W) float32 batches (training images, not the
    images the model is evaluated on). Weights are int8 per output channel when
    ``per_channel``; activations uint8 (U8S8, the fast path of x86 CPUs). ``fp32_nodes`` are
    node names (of the pre-processed graph) left in float. Returns what the export JSON records.
    """
    from onnxruntime.quantization import (
        CalibrationDataReader,
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    if method not in CALIBRATION_METHODS:
        raise ValueError(f"calibration method must be one of {CALIBRATION_METHODS}, got {method}")
    out_path = Path(out_path)
    prepared = preprocess_for_quantization(fp32_path, out_path.with_suffix(".prep.onnx"))
    reader = ImageCalibrationReader(calibration)
    # Registers the reader as a CalibrationDataReader without making it import onnxruntime.
    CalibrationDataReader.register(ImageCalibrationReader)
    calibrate = {
        "minmax": CalibrationMethod.MinMax,
        "entropy": CalibrationMethod.Entropy,
        "percentile": CalibrationMethod.Percentile,
    }[method]
    try:
        quantize_static(
            str(prepared),
            str(out_path),
            reader,
            quant_format=QuantFormat.QDQ,
            per_channel=per_channel,
            activation_type=QuantType.QUInt8,
            weight_type=QuantType.QInt8,
            nodes_to_exclude=list(fp32_nodes),
            calibrate_method=calibrate,
        )
    finally:
        prepared.unlink(missing_ok=True)
    return {
        "path": str(out_path),
        "kind": "static QDQ",
        "weights": "int8 per channel" if per_channel else "int8 per tensor",
        "activations": "uint8",
        "calibration": method,
        "fp32_nodes": list(fp32_nodes),
        "bytes": out_path.stat().st_size,
    }


def quantize_dynamic_int8(fp32_path: str | Path, out_path: str | Path) -> dict[str, Any]:
    """Dynamic int8 model of ``fp32_path`` at ``out_path`` (int8 weights, runtime ranges)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    out_path = Path(out_path)
    prepared = preprocess_for_quantization(fp32_path, out_path.with_suffix(".prep.onnx"))
    try:
        quantize_dynamic(str(prepared), str(out_path), weight_type=QuantType.QUInt8)
    finally:
        prepared.unlink(missing_ok=True)
    return {
        "path": str(out_path),
        "kind": "dynamic",
        "weights": "uint8 per tensor",
        "activations": "uint8, ranges measured per run",
        "bytes": out_path.stat().st_size,
    }


def node_names(path: str | Path, op_types: Sequence[str] = ()) -> list[str]:
    """Names of the nodes of ``path`` (only those of ``op_types`` when given), in graph order."""
    import onnx

    graph = onnx.load(str(path)).graph
    return [node.name for node in graph.node if not op_types or node.op_type in op_types]


def nodes_of_modules(path: str | Path, modules: Sequence[str]) -> list[str]:
    """Names of the nodes of ``path`` that PyTorch modules ``modules`` (``net.head.prob.6``, or
    a parent such as ``net.head``) exported, read from the scopes the dynamo exporter records
    in each node's metadata (``pkg.torch.onnx.name_scopes``). A convolution followed by a
    BatchNorm is exported folded into one Conv under the BatchNorm's scope
    (``net.backbone.bn1`` for the stem), so name the BatchNorm, or a parent module.

    Raises ValueError naming a module that matches no node (a typo, or a TorchScript export,
    which records no scopes).
    """
    import ast

    import onnx

    scopes = {}
    for node in onnx.load(str(path)).graph.node:
        for prop in node.metadata_props:
            if prop.key == "pkg.torch.onnx.name_scopes":
                scopes[node.name] = set(ast.literal_eval(prop.value))
    names = []
    for module in modules:
        matched = [name for name, scope in scopes.items() if module in scope]
        if not matched:
            raise ValueError(
                f"no node of {path} comes from module {module!r} (module paths as in "
                "net.named_modules(), e.g. net.head.prob.6; needs a dynamo export)"
            )
        names += [name for name in matched if name not in names]
    return names
