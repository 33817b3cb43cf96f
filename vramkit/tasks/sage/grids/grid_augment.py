"""ARC augmentations: the 8 dihedral transforms and permutations of colours 1–9.

A transform is applied to *every* grid of an example (demonstrations, query and answer) so the
task's rule still holds after it; colour 0 (the usual background) is never permuted. Views used
for cached teacher features come from :func:`view_transform`, which is a pure function of the
example's key, the view number and a seed, so the teacher and the student see the same views.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import numpy as np

from vramkit.tasks.sage.grids.grid_tokens import NUM_COLOURS

NUM_DIHEDRAL = 8
_IDENTITY_COLOURS = tuple(range(NUM_COLOURS))


@dataclass(frozen=True)
class GridTransform:
    """Rotate by ``rotations`` quarter turns, then transpose if asked, then recolour."""

    rotations: int = 0  # counter-clockwise quarter turns (numpy.rot90), 0..3
    transpose: bool = False  # transpose after rotating: with the rotations, the 8 dihedral maps
    colours: tuple[int, ...] = _IDENTITY_COLOURS  # colours[c] is the new colour of colour c

    def __post_init__(self) -> None:
        if self.rotations not in range(4):
            raise ValueError(f"rotations must be 0..3, got {self.rotations}")
        if sorted(self.colours) != list(_IDENTITY_COLOURS) or self.colours[0] != 0:
            raise ValueError(
                f"colours must permute 0..9 and keep 0 in place, got {list(self.colours)}"
            )

    @property
    def is_identity(self) -> bool:
        return self.rotations == 0 and not self.transpose and self.colours == _IDENTITY_COLOURS

    def apply(self, grid: np.ndarray) -> np.ndarray:
        """The transformed copy of a (h, w) colour grid."""
        moved = np.rot90(grid, self.rotations)
        if self.transpose:
            moved = moved.T
        return np.asarray(self.colours, dtype=grid.dtype)[moved]

    def invert(self, grid: np.ndarray) -> np.ndarray:
        """The grid ``g`` with ``apply(g) == grid``: undoes this transform."""
        recoloured = np.argsort(np.asarray(self.colours)).astype(grid.dtype)[grid]
        if self.transpose:
            recoloured = recoloured.T
        return np.ascontiguousarray(np.rot90(recoloured, -self.rotations))


IDENTITY = GridTransform()


def dihedral_transforms() -> list[GridTransform]:
    """The 8 symmetries of the square, without recolouring."""
    return [
        GridTransform(rotations=rotations, transpose=transpose)
        for transpose in (False, True)
        for rotations in range(4)
    ]


def random_transform(
    rng: np.random.Generator, *, dihedral: bool = True, colours: bool = True
) -> GridTransform:
    """A uniformly drawn transform from the enabled families (identity when both are off)."""
    index = int(rng.integers(NUM_DIHEDRAL)) if dihedral else 0
    permutation = _IDENTITY_COLOURS
    if colours:
        permutation = (0, *(int(c) for c in rng.permutation(np.arange(1, NUM_COLOURS))))
    return GridTransform(rotations=index % 4, transpose=index >= 4, colours=permutation)


def view_transform(
    key: str, view: int, *, seed: int, dihedral: bool = True, colours: bool = True
) -> GridTransform:
    """The transform of augmented view ``view`` of the example ``key``; view 0 is the original.

    Stable across processes and Python versions (no ``hash()``), so features extracted once
    line up with the views the student's loader builds later.
    """
    if view < 0:
        raise ValueError(f"view must be >= 0, got {view}")
    if view == 0:
        return IDENTITY
    rng = np.random.default_rng([seed, view, zlib.crc32(key.encode())])
    return random_transform(rng, dihedral=dihedral, colours=colours)
