"""DBNet → ONNX: the probability map of normalised images, with dynamic batch, height and width.

The exported graph is what inference needs and nothing more: ``images`` (B, 3, H, W) float32,
ImageNet-normalised as :func:`~vramkit.tasks.text_detection.data.device_inputs.normalize_images`
makes
them, H and W multiples of 32 px → ``prob`` (B, H, W) in [0, 1]. The threshold branch, which only
the training loss reads, is not in the graph.

The default exporter is ``torch.onnx.export(..., dynamo=True)`` (torch.export + onnxscript), the
one PyTorch maintains and defaults to since 2.9; the TorchScript exporter (``dynamo=False``) is
deprecated (https://docs.pytorch.org/docs/stable/onnx.html) but still runs, about 6x faster on
this small network, so ``exporter="torchscript"`` stays available. With dynamo, height and width
are declared as ``32 * Dim`` so torch.export proves the network's "multiple of 32 px" check once,
for every size.
"""

from __future__ import annotations

import copy
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from vramkit.tasks.text_detection.network.dbnet import SIZE_MULTIPLE

INPUT_NAME = "images"
OUTPUT_NAME = "prob"
DEFAULT_OPSET = 18
"""Opset 18: the exporter's own default, and above the 13 that per-channel QDQ needs."""
MAX_SIDE_PX = 4096
"""Largest height and width the exported graph admits (px)."""


class ProbabilityMap(nn.Module):
    """A DBNet in eval mode that returns only its probability map (B, H, W)."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, images: Tensor) -> Tensor:
        return self.net(images, training_maps=False)["prob"]


def export_dbnet(
    net: nn.Module,
    path: str | Path,
    *,
    opset: int = DEFAULT_OPSET,
    sample_size: tuple[int, int] = (320, 320),
    exporter: str = "dynamo",
) -> dict[str, Any]:
    """Export ``net`` (a DBNet) to ``path`` and check the file with ``onnx.checker``.

    ``sample_size`` (height, width px, multiples of 32) is the traced example; the graph
    accepts any batch and any height and width that are multiples of 32 up to
    :data:`MAX_SIDE_PX`. ``exporter`` is ``"dynamo"`` or ``"torchscript"``. Returns what the
    export JSON records: the path, opset, exporter, input and output names and their dimension
    names, and the file size in bytes.
    """
    import onnx

    height, width = sample_size
    if height % SIZE_MULTIPLE or width % SIZE_MULTIPLE:
        raise ValueError(f"sample_size must be multiples of {SIZE_MULTIPLE} px, got {sample_size}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # A copy in NCHW, ONNX's layout: torch.export fails on NHWC weights (model.channels_last)
    # with dynamic height and width (a ValueRangeError in its shape guards, torch 2.13), and the
    # caller's network keeps its layout and its training mode.
    wrapper = ProbabilityMap(copy.deepcopy(net).to(memory_format=torch.contiguous_format)).eval()
    example = torch.zeros(1, 3, height, width)
    if exporter == "dynamo":
        _export_dynamo(wrapper, example, path, opset)
    elif exporter == "torchscript":
        _export_torchscript(wrapper, example, path, opset)
    else:
        raise ValueError(f"exporter must be 'dynamo' or 'torchscript', got {exporter!r}")
    model = onnx.load(str(path))
    # full_check also runs onnx's shape inference over the whole graph.
    onnx.checker.check_model(model, full_check=True)
    return {
        "path": str(path),
        "exporter": f"torch.onnx.export(dynamo={exporter == 'dynamo'}), torch {torch.__version__}",
        "opset": opset,
        "onnx_checker": "passed (full_check)",
        "input": {"name": INPUT_NAME, "shape": _dims(model.graph.input[0])},
        "output": {"name": OUTPUT_NAME, "shape": _dims(model.graph.output[0])},
        "bytes": path.stat().st_size,
    }


def _dims(value_info: Any) -> list[int | str]:
    return [dim.dim_param or dim.dim_value for dim in value_info.type.tensor_type.shape.dim]


def _export_dynamo(wrapper: nn.Module, example: Tensor, path: Path, opset: int) -> None:
    steps = MAX_SIDE_PX // SIZE_MULTIPLE
    batch = torch.export.Dim("batch", min=1, max=1024)
    rows = torch.export.Dim("height_div32", min=1, max=steps)
    cols = torch.export.Dim("width_div32", min=1, max=steps)
    program = torch.onnx.export(
        wrapper,
        (example,),
        dynamo=True,
        opset_version=opset,
        input_names=[INPUT_NAME],
        output_names=[OUTPUT_NAME],
        dynamic_shapes={"images": {0: batch, 2: SIZE_MULTIPLE * rows, 3: SIZE_MULTIPLE * cols}},
        verbose=False,
    )
    program.save(str(path))


def _export_torchscript(wrapper: nn.Module, example: Tensor, path: Path, opset: int) -> None:
    with warnings.catch_warnings():
        # The deprecation notice of dynamo=False: the user chose this exporter.
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.onnx.export(
            wrapper,
            (example,),
            str(path),
            dynamo=False,
            opset_version=opset,
            input_names=[INPUT_NAME],
            output_names=[OUTPUT_NAME],
            dynamic_axes={
                INPUT_NAME: {0: "batch", 2: "height", 3: "width"},
                OUTPUT_NAME: {0: "batch", 1: "height", 2: "width"},
            },
        )
