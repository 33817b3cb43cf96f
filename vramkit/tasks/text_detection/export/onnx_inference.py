"""Run an exported DBNet with onnxruntime behind the interface of the PyTorch network.

:class:`OnnxDBNet` is a module whose ``forward`` returns ``{"prob": (B, H, W)}`` like
:class:`~vramkit.tasks.text_detection.network.dbnet.DBNet` in eval mode, so the LightningModule's
validation, post-processing and submission writer run unchanged on it:
:func:`use_onnxruntime` swaps it in (``python eval.py backend=onnxruntime onnx_path=...``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from vramkit.tasks.text_detection.export.onnx_export import INPUT_NAME, OUTPUT_NAME


def make_session(path: str | Path, *, threads: int | None = None) -> Any:
    """An onnxruntime CPU session of ``path``; ``threads`` intra-op threads (None: all cores)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    if threads is not None:
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
    return ort.InferenceSession(str(path), sess_options=options, providers=["CPUExecutionProvider"])


class OnnxDBNet(nn.Module):
    """An exported DBNet (``onnx_export.export_dbnet``) run by onnxruntime on the CPU.

    Takes the normalised float images the PyTorch network takes; returns ``prob`` (B, H, W)
    float32 on the device of the input. It has no parameters and never trains.
    """

    def __init__(self, path: str | Path, *, threads: int | None = None) -> None:
        super().__init__()
        self.path = Path(path)
        if not self.path.is_file():
            raise FileNotFoundError(f"no ONNX model at {self.path}")
        self.session = make_session(self.path, threads=threads)

    def forward(self, images: Tensor, *, training_maps: bool | None = None) -> dict[str, Tensor]:
        if training_maps:
            raise ValueError("an exported DBNet has only the probability map: no training maps")
        array = images.detach().to("cpu", torch.float32).contiguous().numpy()
        (prob,) = self.session.run([OUTPUT_NAME], {INPUT_NAME: array})
        return {"prob": torch.from_numpy(np.asarray(prob)).to(images.device)}

    def __getstate__(self) -> dict[str, Any]:
        raise TypeError("an onnxruntime session cannot be pickled; rebuild OnnxDBNet from its path")


def use_onnxruntime(module: Any, onnx_path: str | Path, *, threads: int | None = None) -> Any:
    """``module`` (a TextDetectionModule) with its network replaced by the exported ``onnx_path``.

    The rest of the module (post-processing settings, ICDAR matching, predictions) is kept,
    so the metrics come from the same code as with the PyTorch backend.
    """
    module.net = OnnxDBNet(onnx_path, threads=threads)
    return module
