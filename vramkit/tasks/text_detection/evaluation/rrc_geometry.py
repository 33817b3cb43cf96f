"""The Polygon library's area and intersection of quads, vectorised, as the official script uses.

The official ICDAR 2015 script builds each quad with ``Polygon.Polygon(points)`` (Polygon2/3, a
wrapper of Alan Murta's General Polygon Clipper) and uses two numbers:

- ``area()``: for one contour, ``0.5 * |shoelace sum|`` (``poly_c_area`` in Polygon's
  ``PolyUtil.c``). For a self-intersecting quad the two lobes have opposite orientations, so the
  area is the *difference* of the lobes: a symmetric bow-tie has area 0.
- ``(p & q).area()``: GPC clips with the even-odd rule, so the intersection sees each lobe of a
  bow-tie as filled: the intersection of a bow-tie with itself is the *sum* of its lobes.

Here the even-odd region of every quad is cut into at most two convex pieces with weights ±1,
whose weighted sum is the region's indicator almost everywhere:

- a convex quad with area: itself;
- a bow-tie (two opposite edges cross at a point X): its two lobes, triangles through X;
- any other quad (non-convex darts, zero-area and repeated-point quads): the fan triangles
  (a, b, c) and (a, c, d), each weighted by its orientation times the quad's. Such a quad's
  winding number never changes sign, so this signed sum is its indicator (all weights are 0
  for a quad without area: its region is empty).

The intersection of two regions is then the weighted sum of at most four convex-convex clips,
done for all pairs at once in numpy. Where a decision lies within rounding of its threshold,
:func:`exact_intersection_area` recomputes the pair in rational arithmetic.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from fractions import Fraction

# Clipped areas agree with exact arithmetic to about 1e-15 of the squared extent of the pair;
# a decision within this much larger margin is recomputed exactly.
AREA_ERROR = 1e-9


def polygon_library_areas(quads: np.ndarray) -> np.ndarray:
    """(n,) ``Polygon(quad).area()`` in px²: half the absolute shoelace sum, lobes subtracted.

    Exact for integer coordinates below 2**25 px, as the script's int32 points are in practice.
    """
    x, y = quads[..., 0], quads[..., 1]
    twice = (x[:, 3] + x[:, 0]) * (y[:, 0] - y[:, 3])
    for i in range(3):  # element-wise: a sum over an axis of length 4 is slower in numpy
        twice = twice + (x[:, i] + x[:, i + 1]) * (y[:, i + 1] - y[:, i])
    return 0.5 * np.abs(twice)


def _orientation(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """Twice the signed area of triangles (a, b, c): > 0 counter-clockwise in x-y axes."""
    return (b[..., 0] - a[..., 0]) * (c[..., 1] - a[..., 1]) - (b[..., 1] - a[..., 1]) * (
        c[..., 0] - a[..., 0]
    )


def _crossing_point(a, b, c, d) -> np.ndarray:
    """Where segment ab meets the line through c and d."""
    side_a, side_b = _orientation(c, d, a), _orientation(c, d, b)
    with np.errstate(divide="ignore", invalid="ignore"):
        fraction = side_a / (side_a - side_b)
    return a + np.nan_to_num(fraction)[..., None] * (b - a)


def even_odd_pieces(quads: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Convex pieces of each quad's even-odd region: (n, 2, 4, 2) vertices and (n, 2) weights.

    A triangle piece repeats its last vertex; an unused piece has weight 0. Orientation tests
    are exact for integer points, so the case of every quad is decided exactly.
    """
    a, b, c, d = quads[:, 0], quads[:, 1], quads[:, 2], quads[:, 3]
    # The four corner turns; each is also the orientation of the triangle it spans.
    abc, bcd, cda, dab = (
        np.sign(_orientation(a, b, c)),
        np.sign(_orientation(b, c, d)),
        np.sign(_orientation(c, d, a)),
        np.sign(_orientation(d, a, b)),
    )
    # Edges ab and cd cross properly when c, d lie strictly on both sides of ab and vice versa.
    first_pair = (abc * dab < 0) & (cda * bcd < 0)
    second_pair = ~first_pair & (bcd * abc < 0) & (dab * cda < 0)  # edges bc and da
    acd = np.sign(_orientation(a, c, d))
    twice_area = _orientation(a, b, c) + _orientation(a, c, d)
    turns_both_ways = ((abc > 0) | (bcd > 0) | (cda > 0) | (dab > 0)) & (
        (abc < 0) | (bcd < 0) | (cda < 0) | (dab < 0)
    )
    simple = ~first_pair & ~second_pair
    convex = simple & (twice_area != 0) & ~turns_both_ways
    pieces = np.empty((len(quads), 2, 4, 2))
    pieces[:, 0] = quads
    pieces[:, 1] = quads
    weights = np.zeros((len(quads), 2))
    weights[convex, 0] = 1.0
    fan = np.flatnonzero(simple & ~convex)
    if fan.size:
        q = quads[fan]
        pieces[fan, 0] = q[:, [0, 1, 2, 2]]
        pieces[fan, 1] = q[:, [0, 2, 3, 3]]
        sign = np.sign(twice_area[fan])
        weights[fan, 0] = abc[fan] * sign
        weights[fan, 1] = acd[fan] * sign
    for crossing, order in ((first_pair, [0, 1, 2, 3]), (second_pair, [1, 2, 3, 0])):
        rows = np.flatnonzero(crossing)
        if rows.size:
            # Renamed so that edges pq and rs cross at x: the lobes are (x, q, r) and (x, s, p).
            p, q, r, s_ = (quads[rows, i] for i in order)
            x = _crossing_point(p, q, r, s_)
            pieces[rows, 0] = np.stack([x, q, r, r], axis=1)
            pieces[rows, 1] = np.stack([x, s_, p, p], axis=1)
            weights[rows] = 1.0
    return pieces, weights


def _segment_inside_spans(
    start_x: np.ndarray,
    start_y: np.ndarray,
    region_x: np.ndarray,
    region_y: np.ndarray,
    boundary_is_inside: bool,
) -> np.ndarray:
    """Twice the ``x dy - y dx`` integral of each closed polygon's edges inside a convex region.

    Coordinates are (vertices, K) arrays, one column per pair, so every numpy pass runs along K:
    the polygon's vertices ``start_*`` (edge i runs from vertex i to i + 1) and the region's
    counter-clockwise vertices ``region_*``. Each edge is clipped to the region's half-planes
    (Cyrus-Beck). An edge lying on a boundary line of the region counts as inside only when
    ``boundary_is_inside`` and it runs the same way as that boundary edge, so a boundary the two
    polygons share is counted once (from one side) and never where they only touch.
    """
    following = [*range(1, len(start_x)), 0]
    direction_x = start_x[following] - start_x  # (E, K)
    direction_y = start_y[following] - start_y
    region_following = [*range(1, len(region_x)), 0]
    edge_x = (region_x[region_following] - region_x)[None]  # (1, R, K)
    edge_y = (region_y[region_following] - region_y)[None]
    origin_cross = edge_x * region_y[None] - edge_y * region_x[None]
    a = edge_x * start_y[:, None] - edge_y * start_x[:, None] - origin_cross  # (E, R, K)
    b = edge_x * direction_y[:, None] - edge_y * direction_x[:, None]
    parallel = b == 0
    with np.errstate(divide="ignore", invalid="ignore"):
        crossing = -a / b
    enter = np.minimum(np.where(b > 0, crossing, 0.0).max(axis=1, initial=0.0), 1.0)
    leave = np.where(b < 0, crossing, 1.0).min(axis=1, initial=1.0)
    outside = parallel & (a < 0)
    if boundary_is_inside:
        same_way = edge_x * direction_x[:, None] + edge_y * direction_y[:, None] > 0
        degenerate = (edge_x == 0) & (edge_y == 0)
        outside |= parallel & (a == 0) & ~same_way & ~degenerate
    else:
        degenerate = (edge_x == 0) & (edge_y == 0)
        outside |= parallel & (a == 0) & ~degenerate
    inside = (enter < leave) & ~outside.any(axis=1)
    first_x = start_x + enter * direction_x
    first_y = start_y + enter * direction_y
    last_x = start_x + leave * direction_x
    last_y = start_y + leave * direction_y
    cross = first_x * last_y - first_y * last_x
    return np.where(inside, cross, 0.0).sum(axis=0)


# Pairs per numpy pass of the overlap kernel: its temporaries stay small enough to be reused
# from the heap instead of being mapped afresh (page faults cost as much as the arithmetic).
_OVERLAP_CHUNK = 8192


def convex_overlap_areas(first: np.ndarray, second: np.ndarray) -> np.ndarray:
    """(K,) areas (px²) of ``first[k] ∩ second[k]`` for convex polygons (K, V, 2), any orientation.

    Green's theorem over the intersection's boundary: the parts of each polygon's edges inside
    the other (Cyrus-Beck clipping of each edge), with fixed shapes and no vertex lists to
    compact, which keeps it a few numpy passes over all pairs.
    """
    if len(first) > _OVERLAP_CHUNK:
        return np.concatenate(
            [
                convex_overlap_areas(first[i : i + _OVERLAP_CHUNK], second[i : i + _OVERLAP_CHUNK])
                for i in range(0, len(first), _OVERLAP_CHUNK)
            ]
        )
    if len(first) == 0:
        return np.zeros(0)
    origin = second[:, :1, :]
    columns = []
    for polygon in (first - origin, second - origin):
        x = np.ascontiguousarray(polygon[..., 0].T)  # (V, K)
        y = np.ascontiguousarray(polygon[..., 1].T)
        following = [*range(1, len(x)), 0]
        clockwise = (x * y[following] - y * x[following]).sum(axis=0) < 0
        x[:, clockwise] = x[::-1, clockwise]
        y[:, clockwise] = y[::-1, clockwise]
        columns.append((x, y))
    (first_x, first_y), (second_x, second_y) = columns
    twice = _segment_inside_spans(first_x, first_y, second_x, second_y, True)
    twice += _segment_inside_spans(second_x, second_y, first_x, first_y, False)
    return 0.5 * twice


def pair_intersection_areas(
    pieces: tuple[np.ndarray, np.ndarray],
    first: np.ndarray,
    other_pieces: tuple[np.ndarray, np.ndarray],
    second: np.ndarray,
    bounds: tuple[np.ndarray, np.ndarray],
) -> tuple[np.ndarray, np.ndarray]:
    """Even-odd intersection areas (px²) of pairs ``first[k]``, ``second[k]``, and error bounds.

    ``pieces`` and ``other_pieces`` come from :func:`even_odd_pieces`; ``bounds`` are the two
    sides' (n, 4) boxes, which scale the rounding error bound of each pair.
    """
    areas = np.zeros(first.size)
    vertices, weights = pieces
    other_vertices, other_weights = other_pieces
    for i in range(2):
        for j in range(2):
            weight = weights[first, i] * other_weights[second, j]
            used = np.flatnonzero(weight)
            if used.size:
                clipped = convex_overlap_areas(
                    vertices[first[used], i], other_vertices[second[used], j]
                )
                areas[used] += weight[used] * clipped
    first_bounds, second_bounds = bounds[0][first], bounds[1][second]
    low = np.minimum(first_bounds[:, :2], second_bounds[:, :2])
    high = np.maximum(first_bounds[:, 2:], second_bounds[:, 2:])
    extent = (high - low).max(axis=1)
    return np.maximum(areas, 0.0), AREA_ERROR * (extent * extent + 1.0)


# Exact arithmetic for the few pairs whose decision lies within rounding of a threshold.


def _exact_orientation(a, b, c) -> Fraction:
    return (b[0] - a[0]) * (c[1] - a[1]) - (b[1] - a[1]) * (c[0] - a[0])


def _exact_pieces(quad: list[tuple[Fraction, Fraction]]) -> list[tuple[int, list]]:
    a, b, c, d = quad

    def cross_properly(p, q, r, s) -> bool:
        return (
            _sign(_exact_orientation(p, q, r)) * _sign(_exact_orientation(p, q, s)) < 0
            and _sign(_exact_orientation(r, s, p)) * _sign(_exact_orientation(r, s, q)) < 0
        )

    def crossing(p, q, r, s):
        side_p, side_q = _exact_orientation(r, s, p), _exact_orientation(r, s, q)
        t = side_p / (side_p - side_q)
        return (p[0] + t * (q[0] - p[0]), p[1] + t * (q[1] - p[1]))

    if cross_properly(a, b, c, d):
        x = crossing(a, b, c, d)
        return [(1, [x, b, c]), (1, [x, d, a])]
    if cross_properly(b, c, d, a):
        y = crossing(b, c, d, a)
        return [(1, [y, c, d]), (1, [y, a, b])]
    sign = _sign(_exact_orientation(a, b, c) + _exact_orientation(a, c, d))
    return [
        (_sign(_exact_orientation(a, b, c)) * sign, [a, b, c]),
        (_sign(_exact_orientation(a, c, d)) * sign, [a, c, d]),
    ]


def _sign(value) -> int:
    return (value > 0) - (value < 0)


def _clip_convex(subject: list, clip: list) -> list:
    """Sutherland-Hodgman in exact arithmetic; ``clip`` is a counter-clockwise convex polygon."""
    output = subject
    for index, start in enumerate(clip):
        end = clip[(index + 1) % len(clip)]
        points, output = output, []
        for k, here in enumerate(points):
            following = points[(k + 1) % len(points)]
            side_here = _exact_orientation(start, end, here)
            side_next = _exact_orientation(start, end, following)
            if side_here >= 0:
                output.append(here)
            if (side_here >= 0) != (side_next >= 0):
                t = side_here / (side_here - side_next)
                output.append(
                    (here[0] + t * (following[0] - here[0]), here[1] + t * (following[1] - here[1]))
                )
        if not output:
            return []
    return output


def _exact_area(points: list) -> Fraction:
    twice = _exact_area_signed(points)
    return abs(twice) / 2 if twice else 0  # int 0, not 0.0: sums stay exact


def exact_intersection_area(first: np.ndarray, second: np.ndarray) -> Fraction:
    """The even-odd intersection area (px²) of two quads, in exact rational arithmetic."""
    from fractions import Fraction  # rarely needed: imported here to keep start-up short

    quads = [
        [(Fraction(float(x)), Fraction(float(y))) for x, y in np.asarray(quad, dtype=np.float64)]
        for quad in (first, second)
    ]
    total = Fraction(0)
    for weight, subject in _exact_pieces(quads[0]):
        if weight == 0:
            continue
        for other_weight, clip in _exact_pieces(quads[1]):
            if other_weight == 0:
                continue
            if _sign(_exact_area_signed(clip)) < 0:
                clip = clip[::-1]
            total += weight * other_weight * _exact_area(_clip_convex(subject, clip))
    return total


def _exact_area_signed(points: list) -> Fraction:
    total = 0
    for index, here in enumerate(points):
        following = points[(index + 1) % len(points)]
        total += here[0] * following[1] - here[1] * following[0]
    return total
