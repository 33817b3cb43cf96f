"""``python scripts/export.py ckpt_path=... format=onnx``: export, quantise, check, record.

From a checkpoint and the config that trained it: the fp32 ONNX model (``dbnet.onnx``), the int8
models asked for (``dbnet.int8_static.onnx``, ``dbnet.int8_dynamic.onnx``), and
``export.json`` beside them with the exporter, opset, the parity of every backend with PyTorch on
the validation images (max abs probability difference, precision, recall, hmean) and whether
each passed. fp32 passes with an identical hmean and a map within ``export.max_abs_prob_diff``;
static int8 with an hmean drop of at most ``export.max_hmean_drop``.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
from omegaconf import DictConfig
from torch.utils.data import DataLoader

from vramkit.core.callbacks.stop_signals import rerun_command, stops_at_once
from vramkit.core.config.instantiate import instantiate
from vramkit.core.config.source import ConfigSource, command_line_overrides
from vramkit.core.io.checkpoint_io import atomic_write_bytes
from vramkit.core.run.checkpoint_setting import checkpoint_setting
from vramkit.core.run.settling.compose import settled_config
from vramkit.core.run.settling.settle import log_decisions, settle
from vramkit.tasks.text_detection.data.device_inputs import normalize_images
from vramkit.tasks.text_detection.data.icdar_folder import (
    TextDetectionDataset,
    collate_text_detection,
)
from vramkit.tasks.text_detection.export.backend_parity import compare_backends
from vramkit.tasks.text_detection.export.export_settings import ExportRequest, ExportSettings
from vramkit.tasks.text_detection.export.onnx_export import export_dbnet
from vramkit.tasks.text_detection.export.onnx_inference import OnnxDBNet
from vramkit.tasks.text_detection.export.onnx_quantize import (
    nodes_of_modules,
    quantize_dynamic_int8,
    quantize_static_qdq,
)

log = logging.getLogger(__name__)

FP32_NAME = "dbnet.onnx"
RECORD_NAME = "export.json"
STAGING_PREFIX = ".export-partial-"
"""The hidden folder (``<prefix><pid>``) the models are made in before they move into place."""


def _settings(cfg: DictConfig) -> tuple[ExportRequest, ExportSettings]:
    source = ConfigSource("conf/export.yaml", command_line_overrides())
    request = ExportRequest.from_config(
        {"ckpt_path": cfg.get("ckpt_path"), "format": cfg.get("format")},
        key_prefix="",
        source=source,
        title="invalid export request",
    )
    settings = ExportSettings.from_config(cfg.export, key_prefix="export.", source=source)
    return request, settings


def load_network(cfg: DictConfig, checkpoint: dict[str, Any]) -> Any:
    """The LightningModule of ``cfg.model`` with the weights of ``checkpoint`` (as
    `checkpoint_setting` read it), in eval mode."""
    module = instantiate(cfg.model)
    module.load_state_dict(checkpoint["state_dict"])
    return module.eval()


def calibration_batches(datamodule: Any, count: int, batch_size: int) -> Iterator[np.ndarray]:
    """The first ``count`` training images, resized as validation resizes them, normalised.

    Training images, so the int8 ranges are never fitted to the images they are scored on; the
    validation resize, so they have the statistics of what the model sees at inference.
    """
    dataset = TextDetectionDataset(datamodule.train_dir, datamodule.val_transform)
    subset = torch.utils.data.Subset(dataset, range(min(count, len(dataset))))
    loader = DataLoader(subset, batch_size=batch_size, collate_fn=collate_text_detection)
    for batch in loader:
        if "image" in batch:
            yield normalize_images(batch["image"]).numpy()


def _validation_batches(datamodule: Any, limit: int | None) -> list[dict[str, Any]]:
    loader = datamodule.val_dataloader()
    batches, seen = [], 0
    for batch in loader:
        if limit is not None and seen >= limit:
            break
        if limit is not None and "image" in batch and seen + len(batch["image"]) > limit:
            keep = limit - seen
            batch = {
                key: value[:keep] if isinstance(value, (list, torch.Tensor)) else value
                for key, value in batch.items()
            }
        seen += len(batch.get("image", ()))
        batches.append(batch)
    return batches


def _verdicts(parity: dict[str, dict[str, float]], settings: ExportSettings) -> dict[str, bool]:
    verdicts = {}
    for name, scores in parity.items():
        if name == "onnx_fp32":
            verdicts[name] = (
                scores["max_abs_prob_diff"] <= settings.max_abs_prob_diff
                and scores["hmean"] == parity["torch"]["hmean"]
            )
        elif name == "int8_static":
            verdicts[name] = -scores["hmean_change"] <= settings.max_hmean_drop
    return verdicts


def export_checkpoint(cfg: DictConfig) -> dict[str, Any]:
    """Export ``cfg.ckpt_path`` as ``cfg.export`` says; returns (and writes) the record.

    The models are made in a hidden folder inside ``export.output_dir`` and moved beside it
    (each rename atomic) only once every one passed through the parity check, the record last:
    SIGTERM or SIGINT stops the export at once with exit status 143 / 130, one line naming the
    command to run again, and no half-written file (the hidden folder is removed).
    """
    with stops_at_once(_stopped):
        return _export_checkpoint(cfg)


def _stopped(received: signal.Signals) -> str:
    return (
        f"{received.name}: the export stopped before it finished and wrote no models or "
        f"{RECORD_NAME}; run it again: {rerun_command('scripts/export.py')}"
    )


def _export_checkpoint(cfg: DictConfig) -> dict[str, Any]:
    request, settings = _settings(cfg)
    # Read first, weights only: a file that is no checkpoint, or would run code, is refused in
    # one line before any work, and the refusal withdraws the exports/ folder Hydra made.
    checkpoint = checkpoint_setting("ckpt_path", request.ckpt_path, mmap=False)
    settlement = settle(cfg, plan_batches=False)
    log_decisions(settlement)
    cfg = settled_config(settlement)
    if cfg.get("seed") is not None:
        L.seed_everything(cfg.seed, workers=True, verbose=False)
    module = load_network(cfg, checkpoint)
    del checkpoint
    datamodule = instantiate(cfg.data)
    datamodule.prepare_data()
    datamodule.setup("validate")
    output_dir = settings.output_dir
    staging = output_dir / f"{STAGING_PREFIX}{os.getpid()}"
    staging.mkdir(parents=True, exist_ok=True)
    try:
        record = _export_into(staging, request, settings, module, datamodule)
        for made in sorted(staging.iterdir()):  # all complete now: each moved whole, by rename
            os.replace(made, output_dir / made.name)
        for model in record["models"].values():
            model["path"] = str(output_dir / Path(model["path"]).name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    atomic_write_bytes(
        output_dir / RECORD_NAME, (json.dumps(record, indent=2) + "\n").encode("utf-8")
    )
    return record


def _export_into(
    output_dir: Path,
    request: ExportRequest,
    settings: ExportSettings,
    module: Any,
    datamodule: Any,
) -> dict[str, Any]:
    # The models into output_dir (the hidden staging folder), checked; their record.
    side = datamodule.settings.val_image_size
    fp32_path = output_dir / FP32_NAME
    log.info(
        "exporting %s with the %s exporter, opset %d", fp32_path, settings.exporter, settings.opset
    )
    models = {
        "onnx_fp32": export_dbnet(
            module.net,
            fp32_path,
            opset=settings.opset,
            sample_size=(side, side),
            exporter=settings.exporter,
        )
    }
    if "static" in settings.quantize:
        models["int8_static"] = quantize_static_qdq(
            fp32_path,
            output_dir / "dbnet.int8_static.onnx",
            calibration_batches(
                datamodule, settings.calibration_images, datamodule.settings.val_batch_size
            ),
            method=settings.calibration_method,
            per_channel=settings.per_channel,
            fp32_nodes=nodes_of_modules(fp32_path, settings.fp32_modules),
        )
        models["int8_static"]["calibration_images"] = settings.calibration_images
        models["int8_static"]["fp32_modules"] = list(settings.fp32_modules)
    if "dynamic" in settings.quantize:
        models["int8_dynamic"] = quantize_dynamic_int8(
            fp32_path, output_dir / "dbnet.int8_dynamic.onnx"
        )

    log.info("comparing %s with PyTorch on validation images", ", ".join(models))
    parity = compare_backends(
        module.net,
        {name: OnnxDBNet(model["path"]) for name, model in models.items()},
        _validation_batches(datamodule, settings.parity_images),
        module.postprocess,
    )
    verdicts = _verdicts(parity, settings)
    record = {
        "checkpoint": str(request.ckpt_path),
        "format": request.format,
        "validation": {"images": parity["torch"]["images"], "image_side_px": side},
        "limits": {
            "max_abs_prob_diff": settings.max_abs_prob_diff,
            "max_hmean_drop": settings.max_hmean_drop,
        },
        "models": models,
        "parity": parity,
        "passed": verdicts,
        "input_note": "images: (B, 3, H, W) float32 RGB, /255 then ImageNet mean/std per channel; "
        "H and W multiples of 32",
    }
    return record
