"""The feature cache: exact round trip in fp16 and bf16, and refusals with clear messages."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from vramkit.tasks.sage.teacher_features.feature_cache import (
    MANIFEST_NAME,
    FeatureCache,
    FeatureCacheError,
    FeatureCacheWriter,
)

TEACHER = {"checkpoint": "/ckpt/teacher.ckpt", "sha256": "a" * 64, "parameters": 10}
DATA = {"train_set": "arc_agi_1/training", "views": 2, "max_length": 1024}
COMMAND = "python scripts/extract_teacher_features.py task=sage_distill"


def _write(directory: Path, dtype: str) -> dict[str, list[torch.Tensor]]:
    lengths = {"train": [3, 5, 2, 4], "val": [6]}
    writer = FeatureCacheWriter(
        directory, width=8, dtype=dtype, lengths=lengths, views={"train": 2, "val": 1}
    )
    torch.manual_seed(0)
    written: dict[str, list[torch.Tensor]] = {}
    for split, sizes in lengths.items():
        written[split] = []
        for item, length in enumerate(sizes):
            features = torch.randn(length, 8)
            writer.write(split, item, features, np.full(length, item, np.uint8))
            written[split].append(features)
    writer.write_predictions("val", np.full((1, 30, 30), 3, np.uint8), np.array([[2, 5]]))
    writer.finish(teacher=TEACHER, data=DATA)
    return written


def _open(directory: Path, *, sha256: str = TEACHER["sha256"], data=DATA) -> FeatureCache:
    return FeatureCache.open(
        directory, teacher_sha256=sha256, data_settings=data, make_command=COMMAND
    )


@pytest.mark.parametrize(
    ("dtype", "torch_dtype"), [("float16", torch.float16), ("bfloat16", torch.bfloat16)]
)
def test_round_trip(tmp_path, dtype, torch_dtype):
    written = _write(tmp_path, dtype)
    cache = _open(tmp_path)
    assert cache.width == 8 and cache.items("train") == 4 and cache.views("train") == 2
    for split, items in written.items():
        for item, features in enumerate(items):
            read = cache.features(split, item)
            assert read.dtype == torch_dtype
            assert torch.equal(read, features.to(torch_dtype))
            assert cache.tokens(split, item).tolist() == [item] * features.shape[0]
    cells, size = cache.teacher_predictions("val")
    assert cells.shape == (1, 30, 30) and size.tolist() == [[2, 5]]
    assert cache.teacher_predictions("train") is None
    manifest = json.loads((tmp_path / MANIFEST_NAME).read_text())
    assert manifest["dtype"] == dtype
    assert manifest["splits"]["train"]["feature_shape"] == [14, 8]
    on_disk = sum(p.stat().st_size for p in tmp_path.iterdir() if p.name != MANIFEST_NAME)
    assert manifest["bytes"] == on_disk


def test_a_missing_cache_names_the_command(tmp_path):
    with pytest.raises(FileNotFoundError, match="make it with `python scripts/extract_teacher"):
        _open(tmp_path / "nothing")


def test_another_teacher_is_refused(tmp_path):
    _write(tmp_path, "float16")
    with pytest.raises(FeatureCacheError, match=r"another teacher.*/ckpt/teacher\.ckpt.*bbbb"):
        _open(tmp_path, sha256="b" * 64)


def test_other_data_is_refused_naming_the_setting(tmp_path):
    _write(tmp_path, "float16")
    with pytest.raises(FeatureCacheError, match=r"views: cache has 2, this run asks for 4"):
        _open(tmp_path, data={**DATA, "views": 4})


def test_a_damaged_file_is_refused(tmp_path):
    _write(tmp_path, "float16")
    with (tmp_path / "train_features.bin").open("r+b") as handle:
        handle.truncate(10)
    with pytest.raises(FeatureCacheError, match="damaged"):
        _open(tmp_path)


def test_an_interrupted_rewrite_leaves_no_manifest(tmp_path):
    _write(tmp_path, "float16")
    writer = FeatureCacheWriter(
        tmp_path, width=8, dtype="float16", lengths={"train": [3]}, views={"train": 1}
    )
    with pytest.raises(RuntimeError, match="never written"):
        writer.finish(teacher=TEACHER, data=DATA)
    with pytest.raises(FileNotFoundError):
        _open(tmp_path)


def test_writes_of_the_wrong_shape_are_refused(tmp_path):
    writer = FeatureCacheWriter(
        tmp_path, width=8, dtype="float16", lengths={"train": [3]}, views={"train": 1}
    )
    with pytest.raises(ValueError, match=r"expected \(3, 8\)"):
        writer.write("train", 0, torch.zeros(4, 8), np.zeros(4, np.uint8))
