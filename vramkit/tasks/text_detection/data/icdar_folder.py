"""A text-detection Dataset over a folder in ICDAR 2015 layout, and its collate function.

Layout: ``<root>/images/<stem>.{jpg,jpeg,png,bmp}`` and ``<root>/gt/gt_<stem>.txt``.

Bad input never stops a non-strict run and is never silent:

- a malformed ground-truth line is skipped with a warning naming file:line (``bad_lines``);
- a line that parses but has bad geometry (bow-tie, zero-area, out-of-image, duplicate, extra
  points, absurd transcription) is repaired or kept as don't-care with a warning naming
  file:line and counted (``geometry_<kind>``; see `annotation_checks`);
- an image without a ground-truth file is left out with a warning (``missing_gt``);
- a ground-truth file without an image is reported (``orphan_gt``);
- an image that cannot be decoded gives ``None`` from ``__getitem__`` with a warning naming it;
  :func:`collate_text_detection` drops it and counts it in the batch's ``skipped``;
- an image with an EXIF orientation tag is read as stored, pixels and ground truth alike, with a
  warning naming it (``exif_orientation_ignored``; see :data:`DECODE_FLAGS`).

With ``strict=True`` the first of these raises: :class:`DataError` (naming the file) or
:class:`~vramkit.tasks.text_detection.data.icdar_format.AnnotationError` (naming file:line).

Validation samples are deterministic, so a dataset given a
:class:`~vramkit.core.io.disk_cache.ValidationCache` computes each one once: the
transformed image (uint8) and its target maps are stored under a key that hashes the image
file's bytes, the ground-truth file's bytes, ``cache_params`` (what the transform depends on),
``target_params`` and :func:`cache_code_version`, and later passes read them back.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import albumentations
import cv2
import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset, default_collate

from vramkit.core.data.bad_lines import warn_file_problems
from vramkit.core.io.disk_cache import ValidationCache, content_key
from vramkit.tasks.text_detection.data.annotation_checks import check_annotation
from vramkit.tasks.text_detection.data.device_inputs import (
    BINARY_MAP_KEYS,
    MAP_KEYS,
    image_to_tensor,
)
from vramkit.tasks.text_detection.data.icdar_format import read_ground_truth
from vramkit.tasks.text_detection.data.targets import make_targets

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp")
# Pixels are decoded as stored, whatever an EXIF orientation tag says. OpenCV's IMREAD_COLOR
# alone turns them by the tag (https://docs.opencv.org/4.x/d8/d6a/group__imgcodecs__flags.html),
# while an ICDAR 2015 ground-truth line is bare pixel corners (https://rrc.cvc.uab.es/?ch=4&com=tasks)
# that the RRC evaluation compares with detections without opening any image: the official images
# carry no tag (none of the toy set's seven does), so their corners are stored-grid px. Annotation
# tools disagree on the tag (VoTT writes stored px, microsoft/VoTT#840; browsers show it applied),
# so a tagged file is read as stored, like its ground truth, and named in a warning.
DECODE_FLAGS = cv2.IMREAD_COLOR | cv2.IMREAD_IGNORE_ORIENTATION
EXIF_ORIENTATION_TAG = 0x0112
# What a reader honouring the tag would do to the stored pixels (EXIF 2.32, tag 0x0112).
EXIF_ORIENTATIONS = {
    2: "mirror left-right",
    3: "rotate 180°",
    4: "mirror top-bottom",
    5: "mirror along the main diagonal",
    6: "rotate 90° clockwise",
    7: "mirror along the anti-diagonal",
    8: "rotate 90° counter-clockwise",
}
# Bump when cached validation samples must be recomputed although no source file below changed.
VAL_CACHE_VERSION = 1
# The code that computes a cached sample; a change to any of these files changes every key.
_CACHED_BY = (
    __name__,
    "vramkit.tasks.text_detection.data.augment",
    "vramkit.tasks.text_detection.data.device_inputs",
    "vramkit.tasks.text_detection.data.targets",
    "vramkit.tasks.text_detection.data.polygon_geometry",
    "vramkit.tasks.text_detection.data.annotation_checks",
)
# (image, polygons, ignore) -> (image, polygons), e.g. augment.PolygonTransform
PolygonTransformFn = Callable[
    [np.ndarray, Sequence[np.ndarray], Sequence[bool]], tuple[np.ndarray, list[np.ndarray]]
]


class DataError(RuntimeError):
    """Unusable input in strict mode (or an unusable folder); the message names the file."""


class DataWarning(UserWarning):
    """Input that was skipped; the message names the file (and line)."""


@functools.cache
def cache_code_version() -> str:
    """Fingerprint of the code behind a cached sample: :data:`VAL_CACHE_VERSION`, the source of
    the modules that compute it, and the OpenCV, albumentations and numpy versions."""
    parts: list[Any] = [VAL_CACHE_VERSION, cv2.__version__, albumentations.__version__]
    parts += [np.__version__]
    for name in _CACHED_BY:
        source = Path(importlib.import_module(name).__file__).read_bytes()
        parts.append(hashlib.sha256(source).hexdigest())
    return content_key(*parts)


def _compact(arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The binary maps as uint8 (exact, a quarter of the bytes); everything else as it is."""
    return {
        name: array.astype(np.uint8) if name in BINARY_MAP_KEYS else array
        for name, array in arrays.items()
    }


@dataclass(frozen=True)
class ImageHeader:
    """What an image file's header says: the stored size and its EXIF orientation tag."""

    height: int
    """Stored rows (px), as :data:`DECODE_FLAGS` decodes them."""
    width: int
    """Stored columns (px)."""
    orientation: int
    """EXIF orientation (1: as stored, also when the file has no tag; 2-8: see
    :data:`EXIF_ORIENTATIONS`)."""


def image_header(path: Path) -> ImageHeader | None:
    """The image file's stored size and EXIF orientation, or None when it cannot be read (the
    image is then skipped, with its warning, when a loader reaches it)."""
    try:
        with Image.open(path) as image:
            width, height = image.size
            orientation = image.getexif().get(EXIF_ORIENTATION_TAG, 1)
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError):
        return None
    return ImageHeader(height, width, orientation if orientation in EXIF_ORIENTATIONS else 1)


def _image_files(images_dir: Path) -> list[Path]:
    return sorted(
        p for p in images_dir.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file()
    )


def layout_problem(root: Path) -> str | None:
    """Why `root` holds no usable item (no images/ folder, no image in it, no image with its
    ground-truth file), or None. The config checks refuse such a folder before any work."""
    images_dir, gt_dir = root / "images", root / "gt"
    expected = f"expected images/<stem>{{{','.join(IMAGE_SUFFIXES)}}} with gt/gt_<stem>.txt"
    if not images_dir.is_dir():
        return f"no images folder {images_dir}: {expected}"
    images = _image_files(images_dir)
    if not images:
        return f"no images in {images_dir}: {expected}"
    if not any((gt_dir / f"gt_{path.stem}.txt").is_file() for path in images):
        return f"no image in {images_dir} has its ground-truth file in {gt_dir}: {expected}"
    return None


def _outside(polygon: np.ndarray, height: int, width: int) -> bool:
    xs, ys = polygon[:, 0], polygon[:, 1]
    return bool(xs.max() < 0 or ys.max() < 0 or xs.min() >= width or ys.min() >= height)


class TextDetectionDataset(Dataset):
    """Images and their DBNet target maps, from ``root/images`` and ``root/gt``.

    Ground truth is parsed once, at construction (see ``check_on_access``). Each item is a dict
    with ``image`` ((3, H, W) uint8 RGB) and ``shrink_map``, ``shrink_mask``, ``thresh_mask``
    ((H, W) uint8, 0 or 1) and
    ``thresh_map`` ((H, W) float32), computed in the loader worker after ``transform``: compact for
    the trip to the main process;
    :func:`vramkit.tasks.text_detection.data.device_inputs.to_model_inputs`
    makes the float inputs on the device. With ``keep_annotations`` it also holds ``name`` (file
    stem), ``polygons`` ((4, 2) float32 in the ORIGINAL image's px coordinates), ``ignore`` (``###``
    flags) and ``original_size`` (h, w).

    ``target_params`` are keyword arguments of
    :func:`vramkit.tasks.text_detection.data.targets.make_targets`.

    ``cache`` (only with a deterministic ``transform``) serves samples computed before; then
    ``cache_params`` must name everything the transform depends on (e.g. the resize side in px),
    since the transform itself is not part of the key. See the module notes.

    ``check_on_access`` parses and checks each ground-truth file when its item is first read
    instead of at construction: the length is the same (images with a ground-truth file), but
    ``problems()`` counts only the files read so far. The memory planner reads one item per
    split; checking the 1,000 files of the default set took it about 0.9 s of CPU time.
    """

    def __init__(
        self,
        root: Path,
        transform: PolygonTransformFn | None,
        *,
        strict: bool = False,
        target_params: dict[str, Any] | None = None,
        keep_annotations: bool = False,
        cache: ValidationCache | None = None,
        cache_params: Mapping[str, Any] | None = None,
        check_on_access: bool = False,
    ) -> None:
        if cache is not None and cache_params is None:
            raise ValueError("a cached dataset needs cache_params: what its transform depends on")
        self.root = Path(root)
        self.transform = transform
        self.strict = strict
        self.target_params = dict(target_params or {})
        self.keep_annotations = keep_annotations
        self.cache = cache
        self.cache_params = dict(cache_params or {})
        self.check_on_access = check_on_access
        self.bad_lines = 0
        self.missing_gt = 0
        self.orphan_gt = 0
        self.exif_orientation_ignored = 0  # images with an orientation tag, read as stored
        self.geometry: dict[str, int] = {}  # geometry_<kind>: annotations found and repaired
        self.image_paths: list[Path] = []
        self._gt_paths: list[Path] = []
        # None until the item's ground truth is read (at construction unless check_on_access).
        self.polygons: list[list[np.ndarray] | None] = []
        self.ignore: list[list[bool] | None] = []
        self.gt_digests: list[str | None] = []  # sha256 of each ground-truth file (with a cache)
        self._index()

    def _warn_or_raise(self, message: str) -> None:
        if self.strict:
            raise DataError(message)
        warnings.warn(message, DataWarning, stacklevel=3)

    def _index(self) -> None:
        images_dir = self.root / "images"
        gt_dir = self.root / "gt"
        problem = layout_problem(self.root)
        if problem is not None:
            raise DataError(problem)
        stems = set()
        for image_path in _image_files(images_dir):
            stems.add(image_path.stem)
            gt_path = gt_dir / f"gt_{image_path.stem}.txt"
            if not gt_path.is_file():
                self.missing_gt += 1
                self._warn_or_raise(f"{image_path}: no ground-truth file {gt_path}; image left out")
                continue
            self.image_paths.append(image_path)
            self._gt_paths.append(gt_path)
            self.polygons.append(None)
            self.ignore.append(None)
            self.gt_digests.append(None)
            if not self.check_on_access:
                self._read_annotations(len(self.image_paths) - 1)
        if gt_dir.is_dir():
            for gt_path in sorted(gt_dir.glob("gt_*.txt")):
                if gt_path.stem[len("gt_") :] not in stems:
                    self.orphan_gt += 1
                    self._warn_or_raise(f"{gt_path}: no image with this name in {images_dir}")

    def _read_annotations(self, index: int) -> None:
        """Parse and check item `index`'s ground-truth file, warning about what was repaired."""
        image_path, gt_path = self.image_paths[index], self._gt_paths[index]
        annotation = read_ground_truth(gt_path, strict=self.strict)
        problems = [("bad_lines", f"{bad}; line skipped") for bad in annotation.bad_lines]
        self.bad_lines += len(annotation.bad_lines)
        header = image_header(image_path)
        if header is not None and header.orientation != 1:
            self.exif_orientation_ignored += 1
            warnings.warn(
                f"{image_path}: EXIF orientation {header.orientation} "
                f"({EXIF_ORIENTATIONS[header.orientation]}) ignored: the image and {gt_path.name} "
                "are read in the stored pixel grid (the ICDAR convention); if the ground truth was "
                "drawn on the turned view, store the pixels turned (e.g. `exiftran -ai`)",
                DataWarning,
                stacklevel=3,
            )
        size = None if header is None else (header.height, header.width)
        checked = check_annotation(annotation, gt_path, size, strict=self.strict)
        for kind, finding in checked.findings:
            key = f"geometry_{kind}"
            self.geometry[key] = self.geometry.get(key, 0) + 1
            problems.append((key, str(finding)))
        # every problem counted above; a few of this file's warned, then one line with the rest
        warn_file_problems(gt_path, problems, DataWarning)
        self.polygons[index] = checked.polygons
        self.ignore[index] = checked.ignore
        if self.cache is not None:
            self.gt_digests[index] = hashlib.sha256(gt_path.read_bytes()).hexdigest()

    def annotations(self, index: int) -> tuple[list[np.ndarray], list[bool]]:
        """Item `index`'s checked polygons ((4, 2) float32, original px) and don't-care flags."""
        polygons, ignore = self.polygons[index], self.ignore[index]
        if polygons is None or ignore is None:
            self._read_annotations(index)
            polygons, ignore = self.polygons[index], self.ignore[index]
        assert polygons is not None and ignore is not None
        return polygons, ignore

    def problems(self) -> dict[str, int]:
        """Counts of the input problems found at construction."""
        counts = {
            "bad_lines": self.bad_lines,
            "missing_gt": self.missing_gt,
            "orphan_gt": self.orphan_gt,
            **self.geometry,
        }
        if self.exif_orientation_ignored:  # listed, like the geometry kinds, only when found
            counts["exif_orientation_ignored"] = self.exif_orientation_ignored
        return counts

    def __len__(self) -> int:
        return len(self.image_paths)

    def _read(self, path: Path) -> bytes | None:
        try:
            return path.read_bytes()
        except OSError as error:
            self._warn_or_raise(f"{path}: cannot read the image ({error.strerror}); skipped")
            return None

    def _decode(self, path: Path, data: bytes) -> np.ndarray | None:
        try:
            image = cv2.imdecode(np.frombuffer(data, dtype=np.uint8), DECODE_FLAGS)
        except cv2.error:
            image = None
        if image is None or image.size == 0:
            self._warn_or_raise(f"{path}: cannot decode the image; skipped")
            return None
        return cv2.cvtColor(image, cv2.COLOR_BGR2RGB)

    def _compute(self, index: int, image: np.ndarray) -> dict[str, Any]:
        """The transformed uint8 image, its target maps and the original (h, w)."""
        original_size = np.array(image.shape[:2], dtype=np.int64)
        polygons, ignore = self.annotations(index)
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
        return {"image": image, **targets.as_dict(), "original_size": original_size}

    def _cached(self, index: int, path: Path, data: bytes) -> dict[str, Any] | None:
        assert self.cache is not None
        key = content_key(
            cache_code_version(),
            self.cache_params,
            self.target_params,
            data,
            self.gt_digests[index],
        )
        stored = self.cache.get(key)
        if stored is not None:
            # Copies: the stored arrays are read-only views of a file mapping.
            return {name: np.array(array) for name, array in stored.items()}
        image = self._decode(path, data)
        if image is None:
            return None  # never cached: a repaired file must be read again
        arrays = _compact(self._compute(index, image))
        self.cache.put(key, arrays)
        return arrays

    def __getitem__(self, index: int) -> dict[str, Any] | None:
        path = self.image_paths[index]
        polygons, ignore = self.annotations(index)
        data = self._read(path)
        if data is None:
            return None
        if self.cache is not None:
            arrays = self._cached(index, path, data)
        else:
            image = self._decode(path, data)
            arrays = None if image is None else _compact(self._compute(index, image))
        if arrays is None:
            return None
        sample: dict[str, Any] = {"image": image_to_tensor(arrays["image"])}
        for key in MAP_KEYS:
            sample[key] = torch.from_numpy(arrays[key])
        if self.keep_annotations:
            sample["name"] = path.stem
            sample["polygons"] = [polygon.astype(np.float32, copy=True) for polygon in polygons]
            sample["ignore"] = list(ignore)
            height, width = (int(side) for side in arrays["original_size"])
            sample["original_size"] = (height, width)
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
            # In a loader worker, default_collate stacks straight into shared memory, which is
            # how the batch reaches the main process: one copy of the batch instead of two.
            batch[key] = default_collate(values)
        else:
            batch[key] = values
    return batch
