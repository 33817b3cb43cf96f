"""A text-detection Dataset over a folder in ICDAR 2015 layout, and its collate function.

Layout: ``<root>/images/<stem>.{jpg,jpeg,png,bmp}`` and ``<root>/gt/gt_<stem>.txt``.

Bad input never stops a non-strict run and is never silent:

- a malformed ground-truth line is skipped with a warning naming file:line (``bad_lines``);
- an image without a ground-truth file is left out with a warning (``missing_gt``);
- a ground-truth file without an image is reported (``orphan_gt``);
- an image that cannot be decoded gives ``None`` from ``__getitem__`` with a warning naming it;
  :func:`collate_text_detection` drops it and counts it in the batch's ``skipped``.

With ``strict=True`` the first of these raises: :class:`DataError` (naming the file) or
:class:`~vramkit.ocr.icdar_format.AnnotationError` (naming file:line).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import torch
from torch.utils.data import Dataset, get_worker_info

from vramkit.ocr.icdar_format import read_ground_truth
from vramkit.ocr.targets import make_targets

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp")
IMAGENET_MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)
IMAGENET_STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)
MAP_KEYS = ("shrink_map", "shrink_mask", "thresh_map", "thresh_mask")

# (image, polygons, ignore) -> (image, polygons), e.g. augment.PolygonTransform
PolygonTransformFn = Callable[
    [np.ndarray, Sequence[np.ndarray], Sequence[bool]], tuple[np.ndarray, list[np.ndarray]]
]


class DataError(RuntimeError):
    """Unusable input in strict mode (or an unusable folder); the message names the file."""


class DataWarning(UserWarning):
    """Input that was skipped; the message names the file (and line)."""


def normalize_image(image: np.ndarray) -> torch.Tensor:
    """(H, W, 3) uint8 RGB → (3, H, W) float32 tensor normalised with the ImageNet mean/std."""
    scaled = image.astype(np.float32) * np.float32(1.0 / 255.0)
    scaled -= IMAGENET_MEAN
    scaled /= IMAGENET_STD
    return torch.from_numpy(np.ascontiguousarray(scaled.transpose(2, 0, 1)))


def _outside(polygon: np.ndarray, height: int, width: int) -> bool:
    xs, ys = polygon[:, 0], polygon[:, 1]
    return bool(xs.max() < 0 or ys.max() < 0 or xs.min() >= width or ys.min() >= height)


class TextDetectionDataset(Dataset):
    """Images and their DBNet target maps, from ``root/images`` and ``root/gt``.

    Ground truth is parsed once, at construction. Each item is a dict with ``image`` (3, H, W)
    float32, normalised) and ``shrink_map``, ``shrink_mask``, ``thresh_map``, ``thresh_mask``
    ((H, W) float32), computed in the loader worker after ``transform``. With
    ``keep_annotations`` it also holds ``name`` (file stem), ``polygons`` ((4, 2) float32 in the
    ORIGINAL image's px coordinates), ``ignore`` (``###`` flags) and ``original_size`` (h, w).

    ``target_params`` are keyword arguments of :func:`vramkit.ocr.targets.make_targets`.
    """

    def __init__(
        self,
        root: Path,
        transform: PolygonTransformFn | None,
        *,
        strict: bool = False,
        target_params: dict[str, Any] | None = None,
        keep_annotations: bool = False,
    ) -> None:
        self.root = Path(root)
        self.transform = transform
        self.strict = strict
        self.target_params = dict(target_params or {})
        self.keep_annotations = keep_annotations
        self.bad_lines = 0
        self.missing_gt = 0
        self.orphan_gt = 0
        self.image_paths: list[Path] = []
        self.polygons: list[list[np.ndarray]] = []
        self.ignore: list[list[bool]] = []
        self._index()

    def _warn_or_raise(self, message: str) -> None:
        if self.strict:
            raise DataError(message)
        warnings.warn(message, DataWarning, stacklevel=3)

    def _index(self) -> None:
        images_dir = self.root / "images"
        gt_dir = self.root / "gt"
        if not images_dir.is_dir():
            raise DataError(f"no images folder: {images_dir} (expected images/ and gt/ in it)")
        candidates = sorted(
            p for p in images_dir.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file()
        )
        if not candidates:
            raise DataError(f"no images ({', '.join(IMAGE_SUFFIXES)}) in {images_dir}")
        stems = set()
        for image_path in candidates:
            stems.add(image_path.stem)
            gt_path = gt_dir / f"gt_{image_path.stem}.txt"
            if not gt_path.is_file():
                self.missing_gt += 1
                self._warn_or_raise(f"{image_path}: no ground-truth file {gt_path}; image left out")
                continue
            annotation = read_ground_truth(gt_path, strict=self.strict)
            for bad in annotation.bad_lines:
                self.bad_lines += 1
                warnings.warn(f"{bad}; line skipped", DataWarning, stacklevel=2)
            self.image_paths.append(image_path)
            self.polygons.append(annotation.polygons)
            self.ignore.append(annotation.ignore)
        if gt_dir.is_dir():
            for gt_path in sorted(gt_dir.glob("gt_*.txt")):
                if gt_path.stem[len("gt_") :] not in stems:
                    self.orphan_gt += 1
                    self._warn_or_raise(f"{gt_path}: no image with this name in {images_dir}")
        if not self.image_paths:
            raise DataError(f"no image in {images_dir} has a ground-truth file in {gt_dir}")

    def problems(self) -> dict[str, int]:
        """Counts of the input problems found at construction."""
        return {
            "bad_lines": self.bad_lines,
            "missing_gt": self.missing_gt,
            "orphan_gt": self.orphan_gt,
        }

    def __len__(self) -> int:
        return len(self.image_paths)

    def _read_image(self, path: Path) -> np.ndarray | None:
        try:
            image = cv2.imread(str(path), cv2.IMREAD_COLOR)
        except cv2.error:
            image = None
        if image is None or image.size == 0:
            self._warn_or_raise(f"{path}: cannot decode the image; skipped")
            return None
        return cv2.cvtColor(image, cv2.COLOR_BGR2RGB)

    def __getitem__(self, index: int) -> dict[str, Any] | None:
        if get_worker_info() is not None:
            # Loader workers already run in parallel: OpenCV's own threads would oversubscribe.
            cv2.setNumThreads(1)
        path = self.image_paths[index]
        image = self._read_image(path)
        if image is None:
            return None
        original_size = image.shape[:2]
        polygons, ignore = self.polygons[index], self.ignore[index]
        if self.transform is not None:
            image, moved = self.transform(image, polygons, ignore)
        else:
            moved = polygons
        height, width = image.shape[:2]
        visible = [i for i, polygon in enumerate(moved) if not _outside(polygon, height, width)]
        targets = make_targets(
            [moved[i] for i in visible],
            [ignore[i] for i in visible],
            height,
            width,
            **self.target_params,
        )
        sample: dict[str, Any] = {"image": normalize_image(image)}
        for key, value in targets.as_dict().items():
            sample[key] = torch.from_numpy(value)
        if self.keep_annotations:
            sample["name"] = path.stem
            sample["polygons"] = [polygon.astype(np.float32, copy=True) for polygon in polygons]
            sample["ignore"] = list(ignore)
            sample["original_size"] = (int(original_size[0]), int(original_size[1]))
        return sample


def collate_text_detection(samples: Sequence[dict[str, Any] | None]) -> dict[str, Any]:
    """Batch samples: tensors are stacked, per-image annotations kept as lists.

    ``None`` samples (unreadable images) are dropped and counted in ``skipped``. When every
    sample of the batch was dropped the batch is ``{"skipped": n}`` with no ``image``; the
    LightningModule skips such a batch (Lightning's collate cannot return ``None``).
    """
    kept = [sample for sample in samples if sample is not None]
    batch: dict[str, Any] = {"skipped": len(samples) - len(kept)}
    if not kept:
        return batch
    for key, first in kept[0].items():
        values = [sample[key] for sample in kept]
        if isinstance(first, torch.Tensor):
            shapes = sorted({tuple(value.shape) for value in values})
            if len(shapes) > 1:
                raise ValueError(
                    f"cannot batch '{key}' of shapes {shapes}: give the dataset a transform "
                    "that brings every image to one size"
                )
            batch[key] = torch.stack(values)
        else:
            batch[key] = values
    return batch
