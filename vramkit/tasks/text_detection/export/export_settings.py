"""The ``export.*`` keys of ``python scripts/export.py`` (conf/export.yaml), as a typed schema."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from vramkit.core.config.settings import ConfigPath, Settings
from vramkit.tasks.text_detection.export.onnx_export import DEFAULT_OPSET


class ExportRequest(Settings):
    """The top-level keys of conf/export.yaml."""

    ckpt_path: ConfigPath
    """The checkpoint to export."""
    format: Literal["onnx"] = "onnx"
    """What to export to; ONNX is the one format so far."""


class ExportSettings(Settings):
    """How the checkpoint is exported, quantised and checked."""

    output_dir: ConfigPath
    """Where the models and ``export.json`` are written."""
    exporter: Literal["dynamo", "torchscript"] = "dynamo"
    """torch.onnx's exporter: dynamo (maintained) or torchscript (deprecated, faster to run)."""
    opset: int = Field(DEFAULT_OPSET, ge=13)
    """ONNX opset; per-channel QDQ quantisation needs 13 or newer."""
    parity_images: int | None = Field(None, gt=0)
    """Validation images compared between backends; null: all of them."""
    max_abs_prob_diff: float = Field(1e-4, gt=0)
    """Largest fp32 probability difference from PyTorch (0..1) that passes."""
    quantize: tuple[Literal["static", "dynamic"], ...] = ("static", "dynamic")
    """int8 models made beside the fp32 one; () for none."""
    calibration_images: int = Field(64, gt=0)
    """Training images static quantisation calibrates activation ranges on."""
    calibration_method: Literal["minmax", "entropy", "percentile"] = "minmax"
    """How activation ranges are taken from the calibration images."""
    per_channel: bool = True
    """int8 weights with one scale per output channel (false: one per tensor)."""
    fp32_modules: tuple[str, ...] = ()
    """PyTorch module paths (``net.head.prob.6``) whose nodes static int8 leaves in float."""
    max_hmean_drop: float = Field(0.01, ge=0)
    """Largest validation hmean loss of the static int8 model that passes."""
