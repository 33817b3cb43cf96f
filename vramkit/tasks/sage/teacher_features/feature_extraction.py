"""Run the teacher once over the student's data and write the feature cache.

The teacher is given the input fields of each batch only (``INPUT_KEYS``): the answer grid is
never in what it sees. Its features for every cached view of every training example, and for
the original view of every validation example, go to a memory-mapped cache
(:mod:`vramkit.tasks.sage.teacher_features.feature_cache`); a teacher that can predict grids also
leaves its
validation predictions there, so the student's validation scores it on the same examples.
"""

from __future__ import annotations

import contextlib
import logging
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from lightning.fabric.utilities.rank_zero import rank_zero_only
from omegaconf import DictConfig
from torch import nn

from vramkit.core.config.instantiate import instantiate
from vramkit.core.data.loaders import DEFAULT_NUM_WORKERS
from vramkit.core.run.settling.compose import settled_config
from vramkit.core.run.settling.settle import log_decisions, settle
from vramkit.core.units import GIB
from vramkit.tasks.sage.data.arc_batching import grid_loader
from vramkit.tasks.sage.data.arc_examples import INPUT_KEYS
from vramkit.tasks.sage.grids.grid_outputs import GridPrediction
from vramkit.tasks.sage.teacher_features.arc_feature_datamodule import (
    STUDENT_TASK,
    SageFeatureDataModule,
)
from vramkit.tasks.sage.teacher_features.commands import FEATURES_ENTRY, suggest_command
from vramkit.tasks.sage.teacher_features.feature_cache import (
    FeatureCache,
    FeatureCacheError,
    FeatureCacheWriter,
)
from vramkit.tasks.sage.teacher_features.teacher_checkpoint import load_teacher

log = logging.getLogger(__name__)

SPLITS = ("train", "val")
AUTOCAST_DTYPES = {"16-mixed": torch.float16, "bf16-mixed": torch.bfloat16}


@rank_zero_only
def _echo(line: str) -> None:
    log.info("features: %s", line)


def input_fields(batch: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    """The fields a teacher may see, on ``device``; the answer (``target``…) is left behind."""
    return {key: batch[key].to(device, non_blocking=True) for key in INPUT_KEYS}


def _teacher_pass(
    teacher: nn.Module, inputs: dict[str, torch.Tensor], *, predicts: bool
) -> tuple[torch.Tensor, GridPrediction | None]:
    if not predicts:
        return teacher.encode_inputs(inputs), None
    if callable(getattr(teacher, "encode_and_predict", None)):
        return teacher.encode_and_predict(inputs)
    return teacher.encode_inputs(inputs), teacher.predict(inputs)


def extract_teacher_features(
    datamodule: SageFeatureDataModule,
    teacher: nn.Module,
    teacher_info: dict[str, Any],
    *,
    device: torch.device,
    autocast_dtype: torch.dtype | None = None,
    batch_size: int = 16,
    num_workers: int = DEFAULT_NUM_WORKERS,
) -> dict[str, Any]:
    """Write the cache of ``teacher`` (described by ``teacher_info``, which holds its sha256)
    for ``datamodule``'s data; returns the manifest."""
    directory = datamodule.cache_directory(teacher_info["sha256"])
    datasets = {split: datamodule.view_dataset(split) for split in SPLITS}
    width = int(teacher.feature_width)
    tokens = sum(sum(d.lengths) for d in datasets.values())
    item_bytes = 2 * width + 1  # fp16/bf16 features and the uint8 token of every position
    _echo(
        f"{sum(len(d) for d in datasets.values())} items, {tokens} tokens × {width} features "
        f"→ {tokens * item_bytes / GIB:.2f} GiB in {directory}"
    )
    writer = FeatureCacheWriter(
        directory,
        width=width,
        dtype=datamodule.settings.feature_dtype,
        lengths={split: d.lengths for split, d in datasets.items()},
        views={split: d.views for split, d in datasets.items()},
    )
    teacher = teacher.to(device).eval()
    autocast = (
        torch.autocast(device.type, dtype=autocast_dtype)
        if autocast_dtype is not None
        else contextlib.nullcontext()
    )
    for split, dataset in datasets.items():
        predicts = split == "val" and callable(getattr(teacher, "predict", None))
        cells = np.zeros((len(dataset), 30, 30), dtype=np.uint8)
        sizes = np.zeros((len(dataset), 2), dtype=np.uint8)
        loader = grid_loader(
            dataset,
            dataset.lengths,
            batch_size,
            shuffle=False,
            num_workers=num_workers,
            pin_memory=device.type == "cuda",
        )
        start = time.perf_counter()
        for number, batch in enumerate(loader, start=1):
            inputs = input_fields(batch, device)
            with torch.inference_mode(), autocast:
                features, prediction = _teacher_pass(teacher, inputs, predicts=predicts)
            lengths = (~batch["padding_mask"]).sum(1).tolist()
            features = features.float().cpu()
            for row, (item, length) in enumerate(zip(batch["item"].tolist(), lengths, strict=True)):
                row_tokens = batch["tokens"][row, :length].numpy().astype(np.uint8)
                writer.write(split, item, features[row, :length], row_tokens)
            if prediction is not None:
                cells[batch["item"].numpy()] = prediction.cells.cpu().numpy()
                sizes[batch["item"].numpy()] = prediction.size.cpu().numpy()
            if number % 50 == 0 or number == len(loader):
                elapsed = time.perf_counter() - start
                _echo(f"{split}: batch {number}/{len(loader)} ({elapsed:.0f} s)")
        if predicts:
            writer.write_predictions(split, cells, sizes)
    return writer.finish(teacher=teacher_info, data=datamodule.cache_settings())


def run_extraction(cfg: DictConfig) -> Path:
    """What ``scripts/extract_teacher_features.py`` does with its composed config.

    Settles the hardware profile (``settle`` + ``settled_config``), builds the student's
    datamodule and the teacher, then writes the cache unless a complete one for this teacher and
    data is already there. Returns its folder.
    """
    if cfg.get("task_name") != STUDENT_TASK:
        raise ValueError(
            f"the features are made for the student's data: run with task={STUDENT_TASK} "
            f"(or an experiment that selects it, e.g. experiment=sage_small); got "
            f"task_name={cfg.get('task_name')!r}"
        )
    # No batch planning: it would plan the student's training, whose data is this very cache.
    settlement = settle(cfg, plan_batches=False)
    log_decisions(settlement)
    cfg = settled_config(settlement)
    datamodule: SageFeatureDataModule = instantiate(cfg.data)
    checkpoint, sha256 = datamodule.resolve_teacher()
    directory = datamodule.cache_directory(sha256)
    command = suggest_command(FEATURES_ENTRY, task=STUDENT_TASK)
    with contextlib.suppress(FileNotFoundError, FeatureCacheError):
        FeatureCache.open(
            directory,
            teacher_sha256=sha256,
            data_settings=datamodule.cache_settings(),
            make_command=command,
        )
        _echo(f"a complete cache for this teacher and data is already at {directory}")
        return directory

    teacher_cfg = cfg.get("teacher") or {}
    loaded = load_teacher(
        checkpoint,
        teacher_cfg.get("net"),
        state_dict_prefix=teacher_cfg.get("state_dict_prefix"),
    )
    teacher = loaded.module
    device = torch.device("cuda" if cfg.hw.accelerator == "gpu" else "cpu")
    _echo(
        f"teacher {loaded.config['_target_']} from {checkpoint} (sha256 {sha256[:16]}…) on {device}"
    )
    teacher_info = {
        "checkpoint": str(checkpoint),
        "sha256": sha256,
        "network": loaded.config,
        "state_dict_prefix": loaded.state_dict_prefix,
        "feature_width": int(teacher.feature_width),
        "parameters": sum(p.numel() for p in teacher.parameters()),
    }
    start = time.perf_counter()
    manifest = extract_teacher_features(
        datamodule,
        teacher,
        teacher_info,
        device=device,
        autocast_dtype=AUTOCAST_DTYPES.get(str(cfg.hw.precision)),
        batch_size=int(cfg.hw.val_batch_size),
        num_workers=int(cfg.hw.num_workers),
    )
    _echo(
        f"wrote {manifest['bytes'] / GIB:.2f} GiB to {directory} in "
        f"{time.perf_counter() - start:.0f} s"
    )
    return directory
