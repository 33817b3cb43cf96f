"""Image augmentation for text detection, carrying the text polygons along (albumentations 2).

Polygons travel through the pipeline as keypoints, four per quadrilateral, with
``remove_invisible=False`` so that none is ever dropped and their order is kept: the i-th group
of four points out of the pipeline is the i-th polygon in. Points may end up outside the image;
the target maps clip them.

Flips are left out on purpose: a mirrored word is not text the detector will ever see.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any

import albumentations as A
import cv2
import numpy as np
import torch
from albumentations.augmentations.geometric import functional as fgeometric

KEYPOINT_PARAMS = A.KeypointParams(format="xy", remove_invisible=False)


class ScaleRotateCrop(A.DualTransform):
    """Random scale and rotation, then a ``size`` x ``size`` px crop, in ONE warp.

    Equivalent to ``Affine(fit_output=True)`` + ``PadIfNeeded`` + a crop, without warping the
    whole enlarged image first (a 3x zoom of a 1280x720 photo is 25 MB that a 640 px crop would
    mostly throw away).

    - ``scale``: zoom range relative to the native size, drawn log-uniformly (a range like
      (0.5, 2.0) zooms in and out equally often).
    - ``rotate_limit``: rotation drawn uniformly from ±``rotate_limit`` degrees.
    - ``text_crop_probability``: chance that the crop window is placed around one of the
      ``text_anchors`` ((x, y) px points passed with the data, e.g. care-word centres)
      instead of uniformly. Where the transformed image is smaller than the crop, it lands at a
      random place in the window and the rest is black.
    """

    def __init__(
        self,
        size: int,
        scale: tuple[float, float] = (0.5, 2.0),
        rotate_limit: float = 10.0,
        text_crop_probability: float = 0.9,
        p: float = 1.0,
    ) -> None:
        super().__init__(p=p)
        low, high = (float(v) for v in scale)
        if not 0 < low <= high:
            raise ValueError(f"scale must be a range 0 < low <= high, got {scale!r}")
        if not 0.0 <= text_crop_probability <= 1.0:
            raise ValueError(
                f"text_crop_probability must lie in [0, 1], got {text_crop_probability}"
            )
        self.size = int(size)
        self.scale = (low, high)
        self.rotate_limit = float(rotate_limit)
        self.text_crop_probability = float(text_crop_probability)

    def get_transform_init_args_names(self) -> tuple[str, ...]:
        return ("size", "scale", "rotate_limit", "text_crop_probability")

    def _window_start(self, low: float, high: float, anchor: float | None) -> float:
        """Start of the crop window along one axis of the transformed image [low, high]."""
        if high - low >= self.size:
            first, last = low, high - self.size  # the window stays inside the image
        else:
            first, last = high - self.size, low  # the window holds the whole image
        if anchor is None:
            return self.py_random.uniform(first, last)
        start = anchor - self.py_random.uniform(0.1, 0.9) * self.size
        return min(max(start, first), last)

    def get_params_dependent_on_data(
        self, params: dict[str, Any], data: dict[str, Any]
    ) -> dict[str, Any]:
        height, width = params["shape"][:2]
        low, high = self.scale
        scale = math.exp(self.py_random.uniform(math.log(low), math.log(high)))
        angle = self.py_random.uniform(-self.rotate_limit, self.rotate_limit)
        zoom = np.eye(3)
        zoom[:2] = cv2.getRotationMatrix2D((width / 2.0, height / 2.0), angle, scale)
        corners = np.array([[0, 0, 1], [width, 0, 1], [width, height, 1], [0, height, 1]])
        outline = corners @ zoom[:2].T
        anchors = data.get("text_anchors")
        anchor = None
        if (
            anchors is not None
            and len(anchors)
            and self.py_random.random() < self.text_crop_probability
        ):
            chosen = np.asarray(anchors[self.py_random.randrange(len(anchors))], dtype=np.float64)
            anchor = zoom[:2, :2] @ chosen + zoom[:2, 2]
        x0 = self._window_start(
            outline[:, 0].min(), outline[:, 0].max(), None if anchor is None else anchor[0]
        )
        y0 = self._window_start(
            outline[:, 1].min(), outline[:, 1].max(), None if anchor is None else anchor[1]
        )
        shift = np.array([[1, 0, -x0], [0, 1, -y0], [0, 0, 1]])
        return {"matrix": shift @ zoom, "zoom": scale}

    def apply(self, img: np.ndarray, matrix: np.ndarray, **params: Any) -> np.ndarray:
        return cv2.warpAffine(
            img,
            matrix[:2],
            (self.size, self.size),
            flags=cv2.INTER_LINEAR,
            borderMode=cv2.BORDER_CONSTANT,
            borderValue=0,
        )

    def apply_to_mask(self, mask: np.ndarray, matrix: np.ndarray, **params: Any) -> np.ndarray:
        return cv2.warpAffine(
            mask,
            matrix[:2],
            (self.size, self.size),
            flags=cv2.INTER_NEAREST,
            borderMode=cv2.BORDER_CONSTANT,
            borderValue=0,
        )

    def apply_to_keypoints(
        self, keypoints: np.ndarray, matrix: np.ndarray, zoom: float, **params: Any
    ) -> np.ndarray:
        return fgeometric.keypoints_affine(
            keypoints, matrix, params["shape"][:2], {"x": zoom, "y": zoom}, cv2.BORDER_CONSTANT
        )


# RGB → YIQ: luma (Y) and two chroma axes (I, Q); a hue change turns (I, Q) about the luma axis.
_RGB_TO_YIQ = np.array(
    [[0.299, 0.587, 0.114], [0.596, -0.274, -0.322], [0.211, -0.523, 0.312]], dtype=np.float64
)
_YIQ_TO_RGB = np.linalg.inv(_RGB_TO_YIQ)
_LUMA = _RGB_TO_YIQ[0]


def colour_jitter_matrix(
    brightness: float, contrast: float, saturation: float, hue: float, mean_luma: float
) -> np.ndarray:
    """The 3x4 affine map of RGB values (0–255) that applies the four jitters in turn.

    ``brightness``, ``contrast`` and ``saturation`` are factors (1 = unchanged), ``hue`` a turn
    of the hue circle (0.5 = half a turn), ``mean_luma`` the image's mean luma (contrast pulls
    every pixel towards it). Every step is linear in RGB, so the four compose exactly.
    """
    scale = brightness * contrast
    desaturate = saturation * np.eye(3) + (1.0 - saturation) * np.outer(np.ones(3), _LUMA)
    angle = 2.0 * np.pi * hue
    turn = np.array(
        [[1.0, 0.0, 0.0], [0.0, np.cos(angle), -np.sin(angle)], [0.0, np.sin(angle), np.cos(angle)]]
    )
    linear = scale * (_YIQ_TO_RGB @ turn @ _RGB_TO_YIQ @ desaturate)
    # Grey maps to grey under desaturation and hue turns, so the contrast offset passes unchanged.
    offset = (1.0 - contrast) * brightness * mean_luma
    return np.hstack([linear, np.full((3, 1), offset)]).astype(np.float32)


class LinearColourJitter(A.ImageOnlyTransform):
    """Random brightness, contrast, saturation and hue, applied as ONE affine colour map.

    Factors are drawn uniformly from ``1 ± brightness``, ``1 ± contrast``, ``1 ± saturation``
    and the hue turn from ``± hue`` (a fraction of the hue circle), as albumentations'
    ``ColorJitter`` draws them. The four steps compose into a 3x4 matrix
    (:func:`colour_jitter_matrix`) applied in one saturating pass over the (H, W, 3) uint8 RGB
    image: about 30 times cheaper than ``ColorJitter``, which goes through HSV and clips after
    each step (measured at 640x640 px). Hue turns the chroma about the grey axis (YIQ), so greys
    stay grey.
    """

    def __init__(
        self,
        brightness: float = 0.3,
        contrast: float = 0.3,
        saturation: float = 0.3,
        hue: float = 0.03,
        p: float = 0.5,
    ) -> None:
        super().__init__(p=p)
        for name, value, limit in (
            ("brightness", brightness, 1.0),
            ("contrast", contrast, 1.0),
            ("saturation", saturation, 1.0),
            ("hue", hue, 0.5),
        ):
            if not 0.0 <= value <= limit:
                raise ValueError(f"{name} must lie in [0, {limit}], got {value!r}")
        self.brightness = float(brightness)
        self.contrast = float(contrast)
        self.saturation = float(saturation)
        self.hue = float(hue)

    def get_transform_init_args_names(self) -> tuple[str, ...]:
        return ("brightness", "contrast", "saturation", "hue")

    def get_params(self) -> dict[str, float]:
        uniform = self.py_random.uniform
        return {
            "brightness_factor": uniform(1.0 - self.brightness, 1.0 + self.brightness),
            "contrast_factor": uniform(1.0 - self.contrast, 1.0 + self.contrast),
            "saturation_factor": uniform(1.0 - self.saturation, 1.0 + self.saturation),
            "hue_turn": uniform(-self.hue, self.hue),
        }

    def apply(
        self,
        img: np.ndarray,
        brightness_factor: float,
        contrast_factor: float,
        saturation_factor: float,
        hue_turn: float,
        **params: Any,
    ) -> np.ndarray:
        mean_luma = float(np.dot(cv2.mean(img)[:3], _LUMA))
        matrix = colour_jitter_matrix(
            brightness_factor, contrast_factor, saturation_factor, hue_turn, mean_luma
        )
        return cv2.transform(img, matrix)


class PolygonTransform:
    """Applies an albumentations pipeline to an image and its polygons.

    ``anchor_crops``: the pipeline holds :class:`ScaleRotateCrop`, so the centres of the care
    polygons are passed along for it to place its crop around text.

    The pipeline is re-seeded from ``torch.initial_seed()`` whenever that seed changes:
    albumentations keeps its own random state, which forked workers would otherwise share and
    repeat. The seed changes once per DataLoader worker, and before every sample that vramkit's
    loaders seed by itself (:mod:`vramkit.core.data.sample_seeds`), which makes a sample's
    augmentation independent of the worker and of where a resumed run started.
    """

    def __init__(self, pipeline: A.Compose, *, anchor_crops: bool = False) -> None:
        self.pipeline = pipeline
        self.anchor_crops = anchor_crops
        self._seeded_with: int | None = None

    def __call__(
        self,
        image: np.ndarray,
        polygons: Sequence[np.ndarray],
        ignore: Sequence[bool] | None = None,
    ) -> tuple[np.ndarray, list[np.ndarray]]:
        """Transform an (H, W, 3) uint8 image and its (N, 2) px polygons, in order.

        ``ignore`` (optional) marks ``###`` polygons, which text-centred crops do not aim at.
        """
        seed = torch.initial_seed()
        if self._seeded_with != seed:
            self.pipeline.set_random_seed(seed % 2**32)
            self._seeded_with = seed
        arrays = [np.asarray(polygon, dtype=np.float32).reshape(-1, 2) for polygon in polygons]
        sizes = [len(array) for array in arrays]
        keypoints = np.concatenate(arrays) if arrays else np.zeros((0, 2), dtype=np.float32)
        inputs: dict[str, Any] = {"image": image, "keypoints": keypoints}
        if self.anchor_crops:
            inputs["text_anchors"] = [
                array.mean(axis=0)
                for index, array in enumerate(arrays)
                if len(array) and (ignore is None or not ignore[index])
            ]
        output = self.pipeline(**inputs)
        moved = np.asarray(output["keypoints"], dtype=np.float32).reshape(-1, 2)
        if len(moved) != len(keypoints):
            raise RuntimeError(
                f"the augmentation pipeline returned {len(moved)} keypoints for {len(keypoints)}; "
                "it must keep every point (remove_invisible=False)"
            )
        bounds = np.cumsum([0, *sizes])
        return output["image"], [moved[start:end] for start, end in itertools.pairwise(bounds)]


def build_train_transform(
    image_size: int = 640,
    *,
    scale: tuple[float, float] = (0.5, 2.0),
    rotate_limit: float = 10.0,
    text_crop_probability: float = 0.9,
    colour_jitter: bool = True,
) -> PolygonTransform:
    """Random scale and rotation with an ``image_size`` px square crop, then colour jitter.

    See :class:`ScaleRotateCrop` for ``scale`` (relative to the native size, the paper's
    recipe), ``rotate_limit`` (degrees) and ``text_crop_probability``.
    """
    transforms: list[A.BasicTransform] = [
        ScaleRotateCrop(
            image_size,
            scale=scale,
            rotate_limit=rotate_limit,
            text_crop_probability=text_crop_probability,
        )
    ]
    if colour_jitter:
        transforms.append(
            LinearColourJitter(brightness=0.3, contrast=0.3, saturation=0.3, hue=0.03, p=0.8)
        )
    pipeline = A.Compose(transforms, keypoint_params=KEYPOINT_PARAMS)
    return PolygonTransform(pipeline, anchor_crops=text_crop_probability > 0)


def build_val_transform(image_size: int = 640) -> PolygonTransform:
    """Resize the whole image to ``image_size`` x ``image_size`` px (aspect ratio not kept)."""
    pipeline = A.Compose([A.Resize(image_size, image_size)], keypoint_params=KEYPOINT_PARAMS)
    return PolygonTransform(pipeline)
