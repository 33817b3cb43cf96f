"""The teacher-feature cache: memory-mapped fp16/bf16 features with a JSON manifest.

Layout of a cache folder, per split (``train``, ``val``)::

    manifest.json                 teacher (checkpoint, sha256, network, width), data settings
                                  and fingerprint, dtype, shapes and bytes of every file
    <split>_features.bin          (tokens, width) raw fp16, or bf16 stored as its int16 bits
    <split>_tokens.bin            (tokens,) uint8 input token ids, to check alignment on read
    <split>_index.npy             (items, 2) int64 offset and length of every item's tokens
    <split>_teacher_cells.npy     (examples, 30, 30) uint8 teacher's predicted grids (optional)
    <split>_teacher_size.npy      (examples, 2) uint8 teacher's predicted height, width

An item is one augmented view of one example: ``item = example × views + view``. Only input
tokens have features; the answer is never run through the teacher. The manifest is written
last, so an interrupted extraction leaves a folder that readers refuse.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vramkit.core.config.schema import ConfigError
from vramkit.core.io.safe_load import UnreadableCheckpointError, load_array

MANIFEST_NAME = "manifest.json"
FORMAT_VERSION = 1
# name → (numpy storage dtype, torch dtype); numpy has no bfloat16, so its bits go as int16
FEATURE_DTYPES: dict[str, tuple[np.dtype, torch.dtype]] = {
    "float16": (np.dtype(np.float16), torch.float16),
    "bfloat16": (np.dtype(np.int16), torch.bfloat16),
}


class FeatureCacheError(ConfigError):
    """A cache that does not belong to this run's teacher or data, or is damaged: a refusal
    (one line, exit 2), whose message says how to make the right one."""


def _array(path: Path, *, mmap: bool = False) -> np.ndarray:
    try:
        return load_array(path, mmap=mmap)
    except UnreadableCheckpointError as error:
        raise FeatureCacheError(f"{error}; re-extract the feature cache") from None


def settings_fingerprint(settings: Mapping[str, Any]) -> str:
    """Hex sha256 of the settings as canonical JSON (what the cache's contents depend on)."""
    canonical = json.dumps(settings, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


def _files(split: str) -> dict[str, str]:
    return {
        "features": f"{split}_features.bin",
        "tokens": f"{split}_tokens.bin",
        "index": f"{split}_index.npy",
        "teacher_cells": f"{split}_teacher_cells.npy",
        "teacher_size": f"{split}_teacher_size.npy",
    }


def _check_dtype(dtype: str) -> tuple[np.dtype, torch.dtype]:
    if dtype not in FEATURE_DTYPES:
        raise ValueError(f"feature dtype must be one of {sorted(FEATURE_DTYPES)}, got {dtype!r}")
    return FEATURE_DTYPES[dtype]


class FeatureCacheWriter:
    """Fills a cache folder item by item; :meth:`finish` writes the manifest."""

    def __init__(
        self,
        directory: Path,
        *,
        width: int,
        dtype: str,
        lengths: Mapping[str, Sequence[int]],
        views: Mapping[str, int],
    ) -> None:
        self.directory = Path(directory)
        self.width = width
        self.dtype = dtype
        self.storage_dtype, self.torch_dtype = _check_dtype(dtype)
        self.views = dict(views)
        self.directory.mkdir(parents=True, exist_ok=True)
        # an old manifest would vouch for files this writer is about to replace
        (self.directory / MANIFEST_NAME).unlink(missing_ok=True)
        self._index: dict[str, np.ndarray] = {}
        self._features: dict[str, np.memmap] = {}
        self._tokens: dict[str, np.memmap] = {}
        self._written: dict[str, np.ndarray] = {}
        self._predictions: set[str] = set()
        for split, split_lengths in lengths.items():
            sizes = np.asarray(split_lengths, dtype=np.int64)
            if sizes.size % self.views[split]:
                raise ValueError(f"{split}: {sizes.size} items is not a multiple of the views")
            offsets = np.concatenate(([0], np.cumsum(sizes)[:-1])) if sizes.size else sizes
            index = np.stack((offsets, sizes), axis=1)
            files = _files(split)
            np.save(self.directory / files["index"], index)
            total = max(int(sizes.sum()), 1)  # numpy cannot map an empty file
            self._index[split] = index
            self._features[split] = np.memmap(
                self.directory / files["features"],
                dtype=self.storage_dtype,
                mode="w+",
                shape=(total, width),
            )
            self._tokens[split] = np.memmap(
                self.directory / files["tokens"], dtype=np.uint8, mode="w+", shape=(total,)
            )
            self._written[split] = np.zeros(len(index), dtype=bool)

    def write(self, split: str, item: int, features: torch.Tensor, tokens: np.ndarray) -> None:
        """Store one item's (length, width) features and its (length,) input tokens."""
        offset, length = (int(v) for v in self._index[split][item])
        if tuple(features.shape) != (length, self.width) or tokens.shape != (length,):
            raise ValueError(
                f"{split} item {item}: expected ({length}, {self.width}) features and {length} "
                f"tokens, got {tuple(features.shape)} and {tokens.shape}"
            )
        stored = features.detach().to("cpu", self.torch_dtype)
        if self.dtype == "bfloat16":
            stored = stored.view(torch.int16)
        self._features[split][offset : offset + length] = stored.numpy()
        self._tokens[split][offset : offset + length] = tokens
        self._written[split][item] = True

    def write_predictions(self, split: str, cells: np.ndarray, size: np.ndarray) -> None:
        """Store the teacher's predicted (examples, 30, 30) grids and (examples, 2) sizes."""
        examples = len(self._index[split]) // self.views[split]
        if cells.shape[0] != examples or size.shape != (examples, 2):
            raise ValueError(f"{split}: teacher predictions must cover its {examples} examples")
        files = _files(split)
        np.save(self.directory / files["teacher_cells"], cells.astype(np.uint8))
        np.save(self.directory / files["teacher_size"], size.astype(np.uint8))
        self._predictions.add(split)

    def finish(self, *, teacher: Mapping[str, Any], data: Mapping[str, Any]) -> dict[str, Any]:
        """Flush the files and write the manifest; returns it."""
        splits = {}
        total_bytes = 0
        for split, index in self._index.items():
            missing = np.flatnonzero(~self._written[split])
            if missing.size:
                raise RuntimeError(f"{split}: {missing.size} item(s) were never written")
            self._features[split].flush()
            self._tokens[split].flush()
            files = _files(split)
            if split not in self._predictions:
                del files["teacher_cells"], files["teacher_size"]
            sizes = {name: (self.directory / file).stat().st_size for name, file in files.items()}
            total_bytes += sum(sizes.values())
            splits[split] = {
                "items": len(index),
                "views": self.views[split],
                "examples": len(index) // self.views[split],
                "tokens": int(index[:, 1].sum()),
                "feature_shape": list(self._features[split].shape),
                "files": files,
                "bytes": sizes,
                "teacher_predictions": split in self._predictions,
            }
        manifest = {
            "format_version": FORMAT_VERSION,
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "dtype": self.dtype,
            "feature_width": self.width,
            "teacher": dict(teacher),
            "data": {"settings": dict(data), "fingerprint": settings_fingerprint(data)},
            "splits": splits,
            "bytes": total_bytes,
        }
        temporary = self.directory / f"{MANIFEST_NAME}.tmp"
        temporary.write_text(json.dumps(manifest, indent=2, default=str))
        os.replace(temporary, self.directory / MANIFEST_NAME)
        return manifest


def _differences(expected: Mapping[str, Any], found: Mapping[str, Any]) -> list[str]:
    expected = json.loads(json.dumps(expected, default=str))
    return [
        f"{key}: cache has {found.get(key)!r}, this run asks for {expected.get(key)!r}"
        for key in sorted(set(expected) | set(found))
        if expected.get(key) != found.get(key)
    ]


class FeatureCache:
    """A checked, read-only cache; memory maps open lazily in every process that reads."""

    def __init__(self, directory: Path, manifest: Mapping[str, Any]) -> None:
        self.directory = Path(directory)
        self.manifest = dict(manifest)
        self.dtype: str = manifest["dtype"]
        self.width: int = int(manifest["feature_width"])
        self.storage_dtype, self.torch_dtype = _check_dtype(self.dtype)
        self._maps: dict[tuple[str, str], np.ndarray] = {}

    @classmethod
    def open(
        cls,
        directory: Path,
        *,
        teacher_sha256: str,
        data_settings: Mapping[str, Any],
        make_command: str,
    ) -> FeatureCache:
        """Open ``directory`` if it holds features of this teacher for these data settings.

        FileNotFoundError (naming ``make_command``) when there is no complete cache;
        FeatureCacheError when it was made by another teacher, for other data, or is damaged.
        """
        directory = Path(directory)
        manifest_path = directory / MANIFEST_NAME
        if not manifest_path.is_file():
            raise FileNotFoundError(
                f"no teacher feature cache at {directory} (no {MANIFEST_NAME}); make it with "
                f"`{make_command}`"
            )
        try:
            manifest = json.loads(manifest_path.read_text())
        except json.JSONDecodeError as error:
            raise FeatureCacheError(f"{manifest_path}: not valid JSON ({error})") from None
        version = manifest.get("format_version")
        if version != FORMAT_VERSION:
            raise FeatureCacheError(
                f"{manifest_path}: cache format {version}, this vramkit reads {FORMAT_VERSION}; "
                f"re-make it with `{make_command}`"
            )
        teacher = manifest["teacher"]
        if teacher.get("sha256") != teacher_sha256:
            raise FeatureCacheError(
                f"the feature cache at {directory} was made by another teacher: its manifest has "
                f"checkpoint {teacher.get('checkpoint')} "
                f"(sha256 {str(teacher.get('sha256'))[:16]}…), "
                f"this run's teacher has sha256 {teacher_sha256[:16]}…; re-extract with "
                f"`{make_command}` or point data.feature_cache at the matching cache"
            )
        found = manifest["data"]["settings"]
        if manifest["data"]["fingerprint"] != settings_fingerprint(data_settings):
            differences = _differences(data_settings, found) or ["(fingerprint differs)"]
            raise FeatureCacheError(
                f"the feature cache at {directory} was made for other data: "
                + "; ".join(differences)
                + f". Re-extract with `{make_command}`"
            )
        cache = cls(directory, manifest)
        cache._check_files()
        return cache

    def _check_files(self) -> None:
        for entry in self.manifest["splits"].values():
            for name, file in entry["files"].items():
                path = self.directory / file
                size = path.stat().st_size if path.is_file() else None
                if size != entry["bytes"][name]:
                    raise FeatureCacheError(
                        f"{path}: {size} bytes on disk, the manifest says {entry['bytes'][name]}; "
                        f"the cache is damaged, re-extract it"
                    )
                if path.suffix == ".npy":  # numbers only: one holding a pickle is refused here
                    _array(path, mmap=True)

    def __getstate__(self) -> dict[str, Any]:
        # memory maps are reopened in every loader worker rather than pickled
        return {**self.__dict__, "_maps": {}}

    def _map(self, split: str, name: str) -> np.ndarray:
        key = (split, name)
        if key not in self._maps:
            entry = self.manifest["splits"][split]
            path = self.directory / entry["files"][name]
            shape = tuple(entry["feature_shape"])
            if name == "features":
                self._maps[key] = np.memmap(path, self.storage_dtype, mode="r", shape=shape)
            elif name == "tokens":
                self._maps[key] = np.memmap(path, np.uint8, mode="r", shape=shape[:1])
            else:
                self._maps[key] = _array(path)
        return self._maps[key]

    def splits(self) -> list[str]:
        return sorted(self.manifest["splits"])

    def items(self, split: str) -> int:
        return int(self.manifest["splits"][split]["items"])

    def views(self, split: str) -> int:
        return int(self.manifest["splits"][split]["views"])

    def features(self, split: str, item: int) -> torch.Tensor:
        """(length, width) features of one item, in the cache's dtype."""
        offset, length = (int(v) for v in self._map(split, "index")[item])
        rows = np.array(self._map(split, "features")[offset : offset + length])
        tensor = torch.from_numpy(rows)
        return tensor.view(torch.bfloat16) if self.dtype == "bfloat16" else tensor

    def tokens(self, split: str, item: int) -> np.ndarray:
        """(length,) uint8 input tokens the item's features were computed from."""
        offset, length = (int(v) for v in self._map(split, "index")[item])
        return np.array(self._map(split, "tokens")[offset : offset + length])

    def teacher_predictions(self, split: str) -> tuple[np.ndarray, np.ndarray] | None:
        """The teacher's (examples, 30, 30) grids and (examples, 2) sizes, if it made any."""
        if not self.manifest["splits"][split]["teacher_predictions"]:
            return None
        return self._map(split, "teacher_cells"), self._map(split, "teacher_size")
