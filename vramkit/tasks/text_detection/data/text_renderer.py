"""Rendering synthetic scene-text images: words and lines on cluttered backgrounds.

The renderer loads its fonts once (matplotlib's DejaVu and STIX families and Pillow's built-in
scalable font, all shipped inside pip packages) and then draws any number of scenes. Every
random choice comes from the ``numpy.random.Generator`` passed in, so a scene is a pure function
of that generator's seed.

A word's ground-truth polygon is its tight ink box in the word's own frame, mapped through the
same homography (rotation and mild perspective) that places its pixels, so the four points go
clockwise from the word's top-left corner.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import cv2
import matplotlib
import numpy as np
from PIL import Image, ImageDraw, ImageFont

from vramkit.tasks.text_detection.data.icdar_format import DONT_CARE

# Text families with full ASCII coverage; the cm* (TeX) fonts map glyphs to odd code points.
MATPLOTLIB_FONT_FILES = (
    "DejaVuSans.ttf",
    "DejaVuSans-Bold.ttf",
    "DejaVuSans-Oblique.ttf",
    "DejaVuSansMono.ttf",
    "DejaVuSansMono-Bold.ttf",
    "DejaVuSerif.ttf",
    "DejaVuSerif-Bold.ttf",
    "DejaVuSerif-Italic.ttf",
    "STIXGeneral.ttf",
    "STIXGeneralBol.ttf",
    "STIXGeneralItalic.ttf",
)

# Pixels of a word mask at or above this alpha (0-255) count as ink for its tight box; the
# faintest anti-aliasing fringe is invisible and would loosen the box.
INK_ALPHA = 48
# Care text must differ from the local background by at least this much luminance (0-255).
MIN_CONTRAST = 100
TINY_FONT_SIZE = (6, 10)  # px, illegible text that is annotated as don't-care
FADED_CONTRAST = (12, 35)  # luminance difference of faded don't-care text
PLACEMENT_ATTEMPTS = 30
FIT_FRACTION = 0.9  # widest text unit, as a fraction of the image side
SHRINK_EVERY = 10  # failed placements before the font size is reduced
FONT_SHRINK = 0.85

_CONSONANTS = "bcdfghjklmnprstvwxyz"
_VOWELS = "aeiouy"


class SceneSpec(Protocol):
    """The scene parameters the renderer reads (``SyntheticTextConfig`` satisfies it)."""

    image_size: int
    words_per_image: tuple[int, int]
    font_size: tuple[int, int]
    max_rotation_deg: float
    perspective: float
    line_probability: float
    dont_care_probability: float
    min_word_height: int
    max_clutter_shapes: int


@dataclass
class RenderedScene:
    """One rendered image and its word-level ground truth."""

    image: np.ndarray  # (H, W, 3) uint8, RGB
    polygons: list[np.ndarray]  # each (4, 2) float32, clockwise from top-left, px
    texts: list[str]  # transcription, or ``###`` for don't-care words


@dataclass
class _TextUnit:
    """A word or a line of words laid out on its own canvas, before placement."""

    mask: np.ndarray  # (h, w) uint8 alpha of the ink
    boxes: np.ndarray  # (n, 4) float32 tight ink boxes x0, y0, x1, y1 in canvas coords
    words: list[str]


def matplotlib_font_dir() -> Path:
    """The folder of TrueType fonts that ships inside matplotlib."""
    return Path(matplotlib.get_data_path()) / "fonts" / "ttf"


def random_word(rng: np.random.Generator) -> str:
    """A pronounceable pseudo-word, a number, a price or a time, in a random letter case."""
    kind = rng.random()
    if kind < 0.08:
        return str(int(rng.integers(1, 10000)))
    if kind < 0.11:
        return f"${int(rng.integers(1, 500))}.{int(rng.integers(0, 100)):02d}"
    if kind < 0.13:
        return f"{int(rng.integers(0, 24))}:{int(rng.integers(0, 60)):02d}"
    syllables = []
    for _ in range(int(rng.integers(1, 4))):
        syllable = _CONSONANTS[rng.integers(len(_CONSONANTS))] + _VOWELS[rng.integers(len(_VOWELS))]
        if rng.random() < 0.35:
            syllable += _CONSONANTS[rng.integers(len(_CONSONANTS))]
        syllables.append(syllable)
    word = "".join(syllables)
    case = rng.random()
    if case < 0.3:
        return word.capitalize()
    if case < 0.5:
        return word.upper()
    return word


def luminance(rgb: np.ndarray) -> np.ndarray:
    """ITU-R BT.601 luma of RGB values in 0-255 (last axis is the channel)."""
    return rgb[..., 0] * 0.299 + rgb[..., 1] * 0.587 + rgb[..., 2] * 0.114


def contrasting_colour(
    rng: np.random.Generator, background_luminance: float, contrast: float
) -> np.ndarray:
    """A random RGB colour whose luminance differs from the background's by ``contrast`` or more.

    The hue is random; the colour is darkened or lightened toward black or white, on whichever
    side of the background has room for the requested contrast.
    """
    colour = rng.uniform(0, 255, 3)
    go_dark = background_luminance - contrast >= 0 and (
        background_luminance + contrast > 255 or rng.random() < 0.5
    )
    current = float(luminance(colour))
    if go_dark:
        target = rng.uniform(0, background_luminance - contrast)
        if current > target:
            colour *= target / max(current, 1e-6)
    else:
        target = rng.uniform(min(background_luminance + contrast, 255), 255)
        if current < target:
            # Blend toward white: luminance is linear in the blend weight.
            weight = (target - current) / max(255 - current, 1e-6)
            colour += (255 - colour) * weight
    return np.clip(colour, 0, 255)


def _random_background(rng: np.random.Generator, size: int) -> np.ndarray:
    kind = rng.random()
    if kind < 0.3:
        image = np.broadcast_to(rng.uniform(0, 255, 3), (size, size, 3)).copy()
    elif kind < 0.65:
        angle = rng.uniform(0, 2 * math.pi)
        coords = np.arange(size, dtype=np.float32) / max(size - 1, 1)
        ramp = (
            np.float32(math.cos(angle)) * coords[None, :]
            + np.float32(math.sin(angle)) * coords[:, None]
        )
        ramp = (ramp - ramp.min()) / max(float(ramp.max() - ramp.min()), 1e-6)
        start = rng.uniform(0, 255, 3).astype(np.float32)
        end = rng.uniform(0, 255, 3).astype(np.float32)
        image = start + (end - start) * ramp[..., None]
    else:
        # Soft blotches around a base colour, like stains or out-of-focus scenery.
        cells = int(rng.integers(3, 9))
        base = rng.uniform(0, 255, 3).astype(np.float32)
        spread = rng.uniform(20, 80)
        blotches = (base + rng.uniform(-spread, spread, (cells, cells, 3))).astype(np.float32)
        image = cv2.resize(blotches, (size, size), interpolation=cv2.INTER_CUBIC)
    return np.clip(image, 0, 255).astype(np.float32)


def _draw_clutter(rng: np.random.Generator, image: np.ndarray, max_shapes: int) -> None:
    """Up to ``max_shapes`` lines, rectangles, ellipses and scribbles (not text), in place."""
    size = image.shape[0]
    for _ in range(int(rng.integers(0, max_shapes + 1))):
        overlay = image.copy()
        colour = tuple(float(c) for c in rng.uniform(0, 255, 3))
        thickness = int(rng.integers(1, 5))
        shape = rng.random()
        if shape < 0.3:
            start = tuple(int(v) for v in rng.integers(-size // 4, size + size // 4, 2))
            end = tuple(int(v) for v in rng.integers(-size // 4, size + size // 4, 2))
            cv2.line(overlay, start, end, colour, thickness, cv2.LINE_AA)
        elif shape < 0.55:
            corner = rng.integers(0, size, 2)
            extent = rng.integers(size // 16, size // 2, 2)
            filled = -1 if rng.random() < 0.5 else thickness
            cv2.rectangle(
                overlay,
                (int(corner[0]), int(corner[1])),
                (int(corner[0] + extent[0]), int(corner[1] + extent[1])),
                colour,
                filled,
            )
        elif shape < 0.8:
            centre = tuple(int(v) for v in rng.integers(0, size, 2))
            axes = tuple(int(v) for v in rng.integers(size // 20, size // 3, 2))
            filled = -1 if rng.random() < 0.5 else thickness
            angle = float(rng.uniform(0, 180))
            cv2.ellipse(overlay, centre, axes, angle, 0, 360, colour, filled, cv2.LINE_AA)
        else:
            steps = rng.normal(0, size / 6, (int(rng.integers(3, 7)), 2)).cumsum(axis=0)
            points = (steps + rng.uniform(0, size, 2)).astype(np.int32)
            cv2.polylines(overlay, [points], False, colour, thickness, cv2.LINE_AA)
        alpha = rng.uniform(0.3, 0.9)
        cv2.addWeighted(overlay, alpha, image, 1 - alpha, 0, dst=image)


def _rotation_about_origin(degrees: float) -> np.ndarray:
    radians = math.radians(degrees)
    cos, sin = math.cos(radians), math.sin(radians)
    return np.array([[cos, -sin, 0], [sin, cos, 0], [0, 0, 1]], dtype=np.float64)


def _translation(x: float, y: float) -> np.ndarray:
    return np.array([[1, 0, x], [0, 1, y], [0, 0, 1]], dtype=np.float64)


def _box_corners(box: np.ndarray) -> np.ndarray:
    x0, y0, x1, y1 = (float(v) for v in box)
    return np.array([[x0, y0], [x1, y0], [x1, y1], [x0, y1]], dtype=np.float64)


def _apply_homography(matrix: np.ndarray, points: np.ndarray) -> np.ndarray:
    homogeneous = np.concatenate([points, np.ones((len(points), 1))], axis=1) @ matrix.T
    return homogeneous[:, :2] / homogeneous[:, 2:3]


def _bounds(boxes: np.ndarray) -> np.ndarray:
    """The union x0, y0, x1, y1 of (n, 4) boxes."""
    return np.array([boxes[:, 0].min(), boxes[:, 1].min(), boxes[:, 2].max(), boxes[:, 3].max()])


def _quad_height(quad: np.ndarray) -> float:
    """The shorter of the two side edges (top-right→bottom-right, bottom-left→top-left), px."""
    return float(min(np.linalg.norm(quad[2] - quad[1]), np.linalg.norm(quad[0] - quad[3])))


class TextRenderer:
    """Draws synthetic scene-text images; construct once, then call :meth:`render` per image."""

    def __init__(self, font_dir: Path | None = None) -> None:
        font_dir = matplotlib_font_dir() if font_dir is None else Path(font_dir)
        self._font_data: list[bytes | None] = []
        for name in MATPLOTLIB_FONT_FILES:
            path = font_dir / name
            if not path.is_file():
                raise FileNotFoundError(f"font file {path} is missing (matplotlib ships it)")
            self._font_data.append(path.read_bytes())
        self._font_data.append(None)  # Pillow's built-in scalable font
        self._fonts: dict[tuple[int, int], ImageFont.FreeTypeFont] = {}
        # Fail at construction, not mid-dataset, if a font cannot be parsed.
        for index in range(len(self._font_data)):
            self.font(index, 20)

    @property
    def num_fonts(self) -> int:
        """How many font faces the renderer draws from."""
        return len(self._font_data)

    def font(self, index: int, size: int) -> ImageFont.FreeTypeFont:
        """Font face ``index`` at ``size`` px (em size), cached."""
        key = (index, size)
        if key not in self._fonts:
            data = self._font_data[index]
            if data is None:
                font = ImageFont.load_default(size)
            else:
                font = ImageFont.truetype(io.BytesIO(data), size)
            self._fonts[key] = font
        return self._fonts[key]

    def _layout(
        self, rng: np.random.Generator, words: list[str], font: ImageFont.FreeTypeFont
    ) -> _TextUnit:
        size = int(font.size)
        ascent, descent = font.getmetrics()
        pad = size // 2 + 2
        space = max(font.getlength(" "), 0.35 * size) * rng.uniform(1.0, 1.5)
        widths = [font.getlength(word) for word in words]
        canvas_width = math.ceil(sum(widths) + space * (len(words) - 1)) + 2 * pad
        canvas_height = ascent + descent + 2 * pad
        mask = np.zeros((canvas_height, canvas_width), dtype=np.uint8)
        boxes = []
        x = float(pad)
        for word, width in zip(words, widths, strict=True):
            # Each word is drawn on its own small canvas so its ink box is measured alone.
            left, top, right, bottom = font.getbbox(word)
            word_image = Image.new("L", (right - left + 4, bottom - top + 4), 0)
            ImageDraw.Draw(word_image).text((2 - left, 2 - top), word, font=font, fill=255)
            alpha = np.asarray(word_image)
            origin_x = math.floor(x) + left - 2
            origin_y = pad + top - 2
            ink = alpha >= INK_ALPHA
            rows = np.flatnonzero(ink.any(axis=1)) + origin_y
            cols = np.flatnonzero(ink.any(axis=0)) + origin_x
            # Pixel i covers [i - 0.5, i + 0.5] in OpenCV's warp convention.
            boxes.append([cols[0] - 0.5, rows[0] - 0.5, cols[-1] + 0.5, rows[-1] + 0.5])
            target = mask[
                origin_y : origin_y + alpha.shape[0], origin_x : origin_x + alpha.shape[1]
            ]
            np.maximum(target, alpha, out=target)
            x += width + space
        return _TextUnit(mask=mask, boxes=np.asarray(boxes, dtype=np.float32), words=words)

    def _place(
        self,
        rng: np.random.Generator,
        unit: _TextUnit,
        spec: SceneSpec,
        occupied: np.ndarray,
    ) -> np.ndarray | None:
        """A homography from the unit's canvas into the image, or None if it does not fit."""
        image_size = spec.image_size
        bounds = _bounds(unit.boxes)
        source = _box_corners(bounds)
        centre = source.mean(axis=0)
        height = float(bounds[3] - bounds[1])
        jitter = rng.uniform(-spec.perspective, spec.perspective, (4, 2)) * height
        destination = source - centre + jitter
        perspective = cv2.getPerspectiveTransform(
            source.astype(np.float32), destination.astype(np.float32)
        ).astype(np.float64)
        # Small angles are the common case in real scenes.
        limit = spec.max_rotation_deg
        angle = rng.triangular(-limit, 0.0, limit) if limit > 0 else 0.0
        placed_at_origin = _rotation_about_origin(angle) @ perspective
        outline = _apply_homography(placed_at_origin, source)
        margin = 2.0
        low = margin - outline.min(axis=0)
        high = image_size - margin - outline.max(axis=0)
        if np.any(high < low):
            return None
        offset = rng.uniform(low, high)
        homography = _translation(*offset) @ placed_at_origin
        # Words keep a gap of a few pixels so their shrunk kernels never touch.
        gap = max(3, int(0.15 * height))
        quad = np.round(_apply_homography(homography, source)).astype(np.int32)
        # Test only the window around the quad, not the whole image.
        x0, y0 = np.maximum(quad.min(axis=0) - gap - 1, 0)
        x1, y1 = np.minimum(quad.max(axis=0) + gap + 2, image_size)
        window = occupied[y0:y1, x0:x1]
        footprint = np.zeros_like(window)
        local = quad - np.array([x0, y0], dtype=np.int32)
        cv2.fillPoly(footprint, [local], 1)
        cv2.polylines(footprint, [local], True, 1, thickness=2 * gap)
        if np.any(footprint & window):
            return None
        window |= footprint
        return homography

    def _render_unit(
        self,
        rng: np.random.Generator,
        image: np.ndarray,
        spec: SceneSpec,
        occupied: np.ndarray,
        words: list[str],
        font_size_range: tuple[int, int],
        *,
        faded: bool = False,
    ) -> list[tuple[np.ndarray, str]]:
        """Lay out, place and blend one unit; returns (quad, word) of every word drawn.

        A line too wide for the image even at the smallest font size is split in two halves.
        """
        font_index = int(rng.integers(self.num_fonts))
        low, high = font_size_range
        # Log-uniform: small and large text equally often per octave.
        size = min(int(math.exp(rng.uniform(math.log(low), math.log(high + 1)))), high)
        unit = self._layout(rng, words, self.font(font_index, size))
        width = float(np.ptp(unit.boxes[:, [0, 2]]))
        usable = FIT_FRACTION * spec.image_size
        if width > usable:
            size = int(size * usable / width)
            if size < low:
                if len(words) == 1:
                    return []
                half = len(words) // 2
                return [
                    *self._render_unit(
                        rng, image, spec, occupied, words[:half], font_size_range, faded=faded
                    ),
                    *self._render_unit(
                        rng, image, spec, occupied, words[half:], font_size_range, faded=faded
                    ),
                ]
            unit = self._layout(rng, words, self.font(font_index, size))
        homography = None
        for attempt in range(1, PLACEMENT_ATTEMPTS + 1):
            homography = self._place(rng, unit, spec, occupied)
            if homography is not None:
                break
            if attempt % SHRINK_EVERY == 0:
                smaller = int(size * FONT_SHRINK)
                if smaller < low:
                    break
                size = smaller
                unit = self._layout(rng, words, self.font(font_index, size))
        if homography is None:
            return []
        if rng.random() < 0.25 and not faded:
            self._draw_plate(rng, image, unit, homography)
        # Warp and blend only the region the unit covers (plus the anti-aliasing fringe).
        outline = _apply_homography(homography, _box_corners(_bounds(unit.boxes)))
        image_size = spec.image_size
        x0, y0 = np.clip(np.floor(outline.min(axis=0)).astype(int) - 3, 0, image_size)
        x1, y1 = np.clip(np.ceil(outline.max(axis=0)).astype(int) + 4, 0, image_size)
        alpha = cv2.warpPerspective(
            unit.mask,
            _translation(-x0, -y0) @ homography,
            (x1 - x0, y1 - y0),
            flags=cv2.INTER_LINEAR,
        ).astype(np.float32)
        alpha /= 255.0
        region = image[y0:y1, x0:x1]
        background = float((luminance(region) * alpha).sum() / max(float(alpha.sum()), 1e-6))
        if faded:
            contrast = rng.uniform(*FADED_CONTRAST)
            colour = contrasting_colour(rng, background, 0.0)
            colour = self._toward_luminance(colour, background, contrast)
        else:
            colour = contrasting_colour(rng, background, MIN_CONTRAST)
        region *= 1.0 - alpha[..., None]
        region += alpha[..., None] * colour.astype(np.float32)
        return [
            (_apply_homography(homography, _box_corners(box)).astype(np.float32), word)
            for box, word in zip(unit.boxes, words, strict=True)
        ]

    @staticmethod
    def _toward_luminance(colour: np.ndarray, background: float, contrast: float) -> np.ndarray:
        """Shift a colour's luminance to ``background ± contrast`` (faded, barely visible text)."""
        sign = 1.0 if background + contrast <= 255 else -1.0
        return np.clip(colour - luminance(colour) + background + sign * contrast, 0, 255)

    @staticmethod
    def _draw_plate(
        rng: np.random.Generator, image: np.ndarray, unit: _TextUnit, homography: np.ndarray
    ) -> None:
        """A sign-like filled quad behind the text (not text itself)."""
        bounds = _bounds(unit.boxes)
        pad = 0.25 * float(bounds[3] - bounds[1])
        padded = bounds + np.array([-pad, -pad, pad, pad])
        quad = np.round(_apply_homography(homography, _box_corners(padded))).astype(np.int32)
        colour = tuple(float(c) for c in rng.uniform(0, 255, 3))
        cv2.fillPoly(image, [quad], colour, cv2.LINE_AA)

    def _plan_units(self, rng: np.random.Generator, spec: SceneSpec) -> list[list[str]]:
        low, high = spec.words_per_image
        remaining = int(rng.integers(low, high + 1))
        units = []
        while remaining > 0:
            if remaining >= 2 and rng.random() < spec.line_probability:
                count = int(rng.integers(2, min(4, remaining) + 1))
            else:
                count = 1
            units.append([random_word(rng) for _ in range(count)])
            remaining -= count
        return units

    def render(self, rng: np.random.Generator, spec: SceneSpec) -> RenderedScene:
        """Draw one ``spec.image_size`` px square scene; all randomness comes from ``rng``."""
        size = spec.image_size
        image = _random_background(rng, size)
        _draw_clutter(rng, image, spec.max_clutter_shapes)
        occupied = np.zeros((size, size), dtype=np.uint8)
        polygons: list[np.ndarray] = []
        texts: list[str] = []
        for words in self._plan_units(rng, spec):
            for quad, word in self._render_unit(rng, image, spec, occupied, words, spec.font_size):
                polygons.append(quad)
                texts.append(word if _quad_height(quad) >= spec.min_word_height else DONT_CARE)
        if rng.random() < spec.dont_care_probability:
            for _ in range(int(rng.integers(1, 4))):
                faded = rng.random() < 0.4
                size_range = spec.font_size if faded else TINY_FONT_SIZE
                words = [random_word(rng)]
                drawn = self._render_unit(
                    rng, image, spec, occupied, words, size_range, faded=faded
                )
                polygons.extend(quad for quad, _ in drawn)
                texts.extend(DONT_CARE for _ in drawn)
        # Luminance noise (one channel, broadcast) costs a third of colour noise.
        noise = np.float32(rng.uniform(0.0, 6.0))
        image += rng.standard_normal((size, size, 1), dtype=np.float32) * noise
        if rng.random() < 0.3:
            # Mild: a stronger blur would wash out the thin strokes of 16 px text.
            cv2.GaussianBlur(image, (0, 0), rng.uniform(0.3, 0.7), dst=image)
        np.clip(image, 0, 255, out=image)
        image += 0.5  # truncation below then rounds to nearest
        return RenderedScene(image=image.astype(np.uint8), polygons=polygons, texts=texts)
