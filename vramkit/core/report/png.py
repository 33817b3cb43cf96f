"""How every picture of the report is titled and saved: the settings that keep drawing cheap.

A report is drawn once per fit, on the training process's clock (``benchmarks/overhead.py``
counts it), so each picture is drawn once (fixed margins, see ``curves.MARGINS_IN``), titled at
a fixed height and written with fast compression.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from matplotlib.axes import Axes
from matplotlib.figure import Figure

PNG_COMPRESS_LEVEL = 1
"""zlib level of the PNG files: 1 is zlib's fastest (Pillow's ``compress_level``, PNG plugin,
default 6; matplotlib hands ``savefig(pil_kwargs=...)`` to ``PIL.Image.save`` in
``matplotlib.image.imsave``). Measured on the overhead benchmark's report (CPU ms of
``PIL.Image.save``, median of 7, level 6 -> 1): the detection picture 45 -> 17 ms and 142 -> 176 kB,
a three-panel chart 17 -> 12 ms and 48 -> 56 kB."""
TITLE_Y = 1.0
"""Height of an axes' title, in axes coordinates (plus matplotlib's ``axes.titlepad``): where
matplotlib's automatic placement puts it too unless x tick labels sit on top (no picture of the
report puts them there) or the y axis prints an offset text (``1e-6``, ``+1``) at its top left,
which a long title may reach. Given explicitly, it switches that placement off
(``Axes.set_title``: a given ``y`` sets ``_autotitlepos`` to False), which measured every tick
label of the axes once more per draw (``Axes._update_title_position`` calls
``yaxis.get_tightbbox``): 25% of the report's drawing time under cProfile, 67k of its 871k
Python calls, on the overhead benchmark's run folder."""


def set_title(axes: Axes, text: str, **text_properties: Any) -> None:
    """Title ``axes`` at :data:`TITLE_Y`, or where matplotlib places it when its y axis prints
    an offset text (``text_properties``: matplotlib ``Text`` keywords, e.g. ``fontsize`` in
    points). Call it once the data and the y limits are set: they decide the offset."""
    if _y_offset_text(axes):
        axes.set_title(text, **text_properties)  # lifted clear of the offset text
    else:
        axes.set_title(text, y=TITLE_Y, **text_properties)


def _y_offset_text(axes: Axes) -> str:
    # What the y axis's formatter prints beside its ticks, from the ticks it will label: the
    # formatter computes it from them at every draw (ScalarFormatter.set_locs), with no text
    # laid out. Only a visible y axis prints it.
    axis = axes.yaxis
    if not (axes.axison and axis.get_visible()):
        return ""
    formatter = axis.get_major_formatter()
    formatter.set_locs(axis.get_majorticklocs())
    return formatter.get_offset()


def save_png(figure: Figure, path: Path, dpi: int) -> Path:
    """Write ``figure`` as a PNG at ``path`` (its folder made when missing), ``dpi`` dots per
    inch, as laid out (no ``bbox_inches="tight"``, which draws the figure once more to measure
    it); returns ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=dpi, pil_kwargs={"compress_level": PNG_COMPRESS_LEVEL})
    return path
