"""A synthetic scene-text detection dataset, written once to disk in ICDAR 2015 format.

Layout::

    <root>/synthetic_text-<hash>/
        manifest.json                      params, counts, hash, per-file checksums, creation time
        train/images/img_00001.jpg  train/gt/gt_img_00001.txt  ...
        val/images/...              val/gt/...

``<hash>`` is a short hash of the parameters (and of the generator version), so changing any
parameter writes a new folder and an unchanged one is reused. Each image's random generator is
seeded from (seed, split, index): the same parameters give byte-identical ground-truth files.
Generation happens in a hidden temporary folder that is renamed into place only when complete,
so an interrupted run never leaves a folder that looks finished. The manifest holds every file's
SHA-256: a file edited, truncated or deleted later is found at the next run, named in a warning
and rendered again (the same bytes, as rendering is deterministic).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import socket
import time
from collections.abc import Iterable
from concurrent.futures import ProcessPoolExecutor
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated, Any

import cv2
import numpy as np
from pydantic import Field

from vramkit.core.config.settings import Settings
from vramkit.core.io.checkpoint_io import atomic_write_bytes
from vramkit.tasks.text_detection.data.icdar_format import DONT_CARE, write_ground_truth
from vramkit.tasks.text_detection.data.text_renderer import TextRenderer

log = logging.getLogger(__name__)

DATASET_NAME = "synthetic_text"
# Bump when the renderer's output changes, so datasets written by older code are not reused.
GENERATOR_VERSION = 2
SPLITS = ("train", "val")
MANIFEST = "manifest.json"
_TEMPORARY_MARK = ".tmp-"
CHUNK_SIZE = 32  # images per task of a generation process
MAX_WORKERS = 8


_AtLeast1 = Annotated[int, Field(ge=1)]
_AtLeast6 = Annotated[int, Field(ge=6)]


class SyntheticTextConfig(Settings):
    """Parameters of the synthetic dataset (``data.synthetic``); every field is part of the
    dataset's hash. Built from a list or an int (Hydra's), a field holds the annotated tuple or
    float, so equal parameters hash equal however written."""

    seed: int = Field(0, ge=0)
    """Seed of every image's random generator (with the split and the index)."""
    num_train: int = Field(1500, ge=1)
    """Training images."""
    num_val: int = Field(100, ge=1)
    """Validation images."""
    image_size: int = Field(320, ge=32)
    """Side of the square images (px)."""
    words_per_image: tuple[_AtLeast1, _AtLeast1] = (3, 10)
    """Text units per image, an inclusive range [low, high]."""
    font_size: tuple[_AtLeast6, _AtLeast6] = (16, 48)
    """Font em size (px), an inclusive range [low, high]."""
    max_rotation_deg: float = Field(15.0, ge=0.0, le=90.0)
    """Largest text rotation (degrees); most angles are near 0 (triangular distribution)."""
    perspective: float = Field(0.1, ge=0.0, le=0.5)
    """Corner jitter as a fraction of the text height."""
    line_probability: float = Field(0.4, ge=0.0, le=1.0)
    """Chance that a text unit is a line of 2-4 words."""
    dont_care_probability: float = Field(0.2, ge=0.0, le=1.0)
    """Chance that an image also holds 1-3 ``###`` words."""
    min_word_height: int = Field(10, ge=1)
    """Words rendered shorter than this (px) are marked ``###``."""
    max_clutter_shapes: int = Field(6, ge=0)
    """Lines, boxes, ellipses, scribbles (not text) per image, at most."""
    jpeg_quality: int = Field(92, ge=1, le=100)
    """JPEG quality of the written images (1-100)."""

    def cross_field_problems(self) -> list[tuple[str, str]]:
        """Ranges whose low end exceeds their high end (run by the config checks)."""
        return [
            (name, f"expected [low, high] with low <= high, got {list(getattr(self, name))}")
            for name in ("words_per_image", "font_size")
            if getattr(self, name)[0] > getattr(self, name)[1]
        ]

    def params(self) -> dict[str, Any]:
        """The parameters as JSON-ready values."""
        return self.model_dump(mode="json")

    def params_hash(self) -> str:
        """Short (12 hex digits) hash of the parameters and the generator version."""
        payload = json.dumps(
            {"params": self.params(), "generator_version": GENERATOR_VERSION}, sort_keys=True
        )
        return hashlib.sha256(payload.encode("utf-8")).hexdigest()[:12]

    def count(self, split: str) -> int:
        """Number of images in ``split`` ("train" or "val")."""
        return {"train": self.num_train, "val": self.num_val}[split]


def synthetic_dataset_dir(root: Path, config: SyntheticTextConfig) -> Path:
    """Where the dataset for ``config`` lives under ``root`` (it may not exist yet)."""
    return Path(root) / f"{DATASET_NAME}-{config.params_hash()}"


def image_name(index: int) -> str:
    """ICDAR-style name of the ``index``-th image (0-based), zero-padded so names sort in order."""
    return f"img_{index + 1:05d}"


def image_rng(seed: int, split: str, index: int) -> np.random.Generator:
    """The generator of one image: a function of (seed, split, index) only."""
    return np.random.default_rng([seed, SPLITS.index(split), index])


def read_manifest(dataset_dir: Path) -> dict[str, Any] | None:
    """The manifest of a dataset folder, or None if it is missing or unreadable."""
    try:
        return json.loads((Path(dataset_dir) / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def is_complete(dataset_dir: Path, config: SyntheticTextConfig) -> bool:
    """True when the folder holds a finished dataset for exactly these parameters, every file
    as the manifest recorded it."""
    return damaged_files(dataset_dir, config) == []


def damaged_files(
    dataset_dir: Path, config: SyntheticTextConfig, *, checksums: bool = True
) -> list[str] | None:
    """The files (relative paths) that differ from the manifest's checksums, or are missing
    (only missing without `checksums`); None when the folder is no finished dataset of these
    parameters at all."""
    dataset_dir = Path(dataset_dir)
    manifest = read_manifest(dataset_dir)
    if manifest is None or manifest.get("hash") != config.params_hash():
        return None
    recorded = manifest.get("files")
    if not isinstance(recorded, dict):
        return None  # written before checksums were recorded: render it again
    expected = {
        _relative(split, index, kind)
        for split in SPLITS
        for index in range(config.count(split))
        for kind in ("image", "gt")
    }
    if set(recorded) != expected:
        return None
    if not checksums:
        return [name for name in sorted(recorded) if not (dataset_dir / name).is_file()]
    return [name for name in sorted(recorded) if _checksum(dataset_dir / name) != recorded[name]]


def _relative(split: str, index: int, kind: str) -> str:
    name = image_name(index)
    return f"{split}/images/{name}.jpg" if kind == "image" else f"{split}/gt/gt_{name}.txt"


def _checksum(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def _checksums(dataset_dir: Path, config: SyntheticTextConfig) -> dict[str, str | None]:
    return {
        name: _checksum(dataset_dir / name)
        for split in SPLITS
        for index in range(config.count(split))
        for kind in ("image", "gt")
        for name in [_relative(split, index, kind)]
    }


def _repair(dataset_dir: Path, config: SyntheticTextConfig, damaged: list[str]) -> None:
    """Render the images whose image or ground-truth file is damaged again, in place."""
    log.warning(
        "synthetic text dataset %s: %d file(s) differ from the manifest (%s); rendering them again",
        dataset_dir,
        len(damaged),
        ", ".join(damaged[:5]) + (", ..." if len(damaged) > 5 else ""),
    )
    renderer = TextRenderer()
    rewritten: list[str] = []
    for split in SPLITS:
        indices = sorted(
            {
                index
                for index in range(config.count(split))
                if {_relative(split, index, "image"), _relative(split, index, "gt")} & set(damaged)
            }
        )
        if indices:
            write_images(renderer, config, split, indices, dataset_dir / split)
            rewritten += [_relative(split, i, kind) for i in indices for kind in ("image", "gt")]
    manifest = read_manifest(dataset_dir)
    assert manifest is not None
    # The same OpenCV encodes the same bytes; another version may not, so record what is there
    # for the files rendered again (and only those: the others were not checked without
    # checksums, and keep what the manifest says they must be).
    manifest["files"].update({name: _checksum(dataset_dir / name) for name in rewritten})
    atomic_write_bytes(dataset_dir / MANIFEST, (json.dumps(manifest, indent=2) + "\n").encode())


def _pid_is_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove_abandoned_temporaries(root: Path, dataset_name: str) -> None:
    """Delete temporary folders left by killed generations on this host.

    A folder from another host, or from a process that still runs here, may be a generation in
    progress and is left alone.
    """
    host = socket.gethostname()
    prefix = f".{dataset_name}{_TEMPORARY_MARK}{host}-"
    for candidate in root.glob(f".{dataset_name}{_TEMPORARY_MARK}*"):
        if not candidate.name.startswith(prefix):
            continue
        pid_text = candidate.name[len(prefix) :]
        if pid_text.isdigit() and not _pid_is_alive(int(pid_text)):
            log.info("removing the abandoned partial dataset %s", candidate)
            shutil.rmtree(candidate, ignore_errors=True)


def write_images(
    renderer: TextRenderer,
    config: SyntheticTextConfig,
    split: str,
    indices: Iterable[int],
    split_dir: Path,
) -> dict[str, int]:
    """Render and write images ``indices`` of ``split`` into ``split_dir``/{images,gt}.

    Returns counts of care words and ``###`` words written.
    """
    images_dir = split_dir / "images"
    gt_dir = split_dir / "gt"
    images_dir.mkdir(parents=True, exist_ok=True)
    gt_dir.mkdir(parents=True, exist_ok=True)
    words = dont_care = 0
    for index in indices:
        name = image_name(index)
        scene = renderer.render(image_rng(config.seed, split, index), config)
        path = images_dir / f"{name}.jpg"
        encoded = cv2.imwrite(
            str(path),
            cv2.cvtColor(scene.image, cv2.COLOR_RGB2BGR),
            [cv2.IMWRITE_JPEG_QUALITY, config.jpeg_quality],
        )
        if not encoded:
            raise OSError(f"could not write {path}")
        write_ground_truth(gt_dir / f"gt_{name}.txt", scene.polygons, scene.texts)
        ignored = sum(text == DONT_CARE for text in scene.texts)
        dont_care += ignored
        words += len(scene.texts) - ignored
    return {"words": words, "dont_care": dont_care}


_worker_renderer: TextRenderer | None = None


def _start_worker() -> None:
    global _worker_renderer
    _worker_renderer = TextRenderer()


def _write_chunk(
    config: SyntheticTextConfig, split: str, indices: range, split_dir: Path
) -> tuple[str, dict[str, int]]:
    assert _worker_renderer is not None, "the pool initializer builds the renderer"
    return split, write_images(_worker_renderer, config, split, indices, split_dir)


def _default_workers(total_images: int) -> int:
    # Below a few chunks, starting processes costs more than it saves.
    if total_images < 4 * CHUNK_SIZE:
        return 1
    return max(1, min(len(os.sched_getaffinity(0)), MAX_WORKERS))


def _write_splits(config: SyntheticTextConfig, directory: Path, workers: int) -> dict:
    counts = {
        split: {"images": config.count(split), "words": 0, "dont_care": 0} for split in SPLITS
    }
    if workers == 1:
        renderer = TextRenderer()
        for split in SPLITS:
            written = write_images(
                renderer, config, split, range(config.count(split)), directory / split
            )
            for key, value in written.items():
                counts[split][key] += value
        return counts
    # The platform's default start method, as torch's DataLoader uses: the workers touch neither
    # torch nor the caller's threads, only numpy, Pillow and OpenCV. A forked worker that
    # inherits a running OpenCV thread pool can deadlock in it, so the pool is stopped before
    # forking (each worker renders on one thread anyway) and restored afterwards.
    opencv_threads = cv2.getNumThreads()
    cv2.setNumThreads(1)
    try:
        return _write_chunks_in_pool(config, directory, workers, counts)
    finally:
        cv2.setNumThreads(opencv_threads)


def _write_chunks_in_pool(
    config: SyntheticTextConfig, directory: Path, workers: int, counts: dict
) -> dict:
    with ProcessPoolExecutor(workers, initializer=_start_worker) as pool:
        futures = [
            pool.submit(
                _write_chunk,
                config,
                split,
                range(start, min(start + CHUNK_SIZE, total)),
                directory / split,
            )
            for split in SPLITS
            for total in [config.count(split)]
            for start in range(0, total, CHUNK_SIZE)
        ]
        for future in futures:
            split, written = future.result()
            for key, value in written.items():
                counts[split][key] += value
    return counts


def ensure_synthetic_dataset(
    root: Path, config: SyntheticTextConfig, *, workers: int | None = None, checksums: bool = True
) -> Path:
    """Return the dataset folder for ``config`` under ``root``, generating it if needed.

    An existing complete dataset with the same parameters is reused untouched; a file that
    differs from the manifest's checksum (or, without ``checksums``, only a missing one) is
    rendered again. Otherwise the
    images are rendered (by ``workers`` processes; default: the available cores, one process for
    small sets) into a hidden temporary folder that is renamed into place at the end; if another
    process finishes the same dataset first, its result is used. The output does not depend on
    ``workers``.
    """
    root = Path(root)
    final = synthetic_dataset_dir(root, config)
    damaged = damaged_files(final, config, checksums=checksums)
    if damaged:
        _repair(final, config, damaged)
        damaged = damaged_files(final, config, checksums=checksums)
    if damaged == []:
        return final
    root.mkdir(parents=True, exist_ok=True)
    _remove_abandoned_temporaries(root, final.name)
    temporary = root / f".{final.name}{_TEMPORARY_MARK}{socket.gethostname()}-{os.getpid()}"
    shutil.rmtree(temporary, ignore_errors=True)
    total = config.num_train + config.num_val
    workers = _default_workers(total) if workers is None else workers
    if workers < 1:
        raise ValueError(f"workers must be at least 1, got {workers}")
    log.info("generating %d synthetic text images into %s (%d processes)", total, final, workers)
    try:
        started = time.perf_counter()
        counts = _write_splits(config, temporary, workers)
        seconds = time.perf_counter() - started
        manifest = {
            "name": DATASET_NAME,
            "hash": config.params_hash(),
            "generator_version": GENERATOR_VERSION,
            "params": config.params(),
            "counts": counts,
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "generation_seconds": round(seconds, 3),
            "generation_processes": workers,
            "images_per_s": round(total / seconds, 2),
            "files": _checksums(temporary, config),
        }
        (temporary / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
        _move_into_place(temporary, final, config)
    finally:
        shutil.rmtree(temporary, ignore_errors=True)
    log.info("synthetic text dataset ready: %s (%.1f images/s)", final, total / seconds)
    return final


def _move_into_place(temporary: Path, final: Path, config: SyntheticTextConfig) -> None:
    if final.exists() and not is_complete(final, config):
        # An incomplete folder under the final name (copied by hand, files deleted): replace it.
        shutil.rmtree(final)
    try:
        temporary.rename(final)
    except OSError:
        # Another process renamed its copy first; that one is as good as ours.
        if not is_complete(final, config):
            raise
