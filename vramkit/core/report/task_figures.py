"""The hook through which a task adds its own pictures to a run's report (core imports no task)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from matplotlib.figure import Figure

from vramkit.core.report.curves import margins
from vramkit.core.report.png import save_png

if TYPE_CHECKING:
    import lightning as L

TASK_FIGURE_PREFIX = "task_"
"""Task pictures are saved as ``report/task_<name>.png``, so a rebuild finds them again."""
IMAGE_MARGINS_IN = {
    "left": 0.1,
    "right": 0.1,
    "bottom": 0.1,
    "top": 0.45,
    "wspace": 0.2,
    "hspace": 0.5,
}
"""Room around and between the pictures of a grid of images without axes (inches): a title of
two 8-9 pt lines above each."""


def image_grid_margins(size_in: tuple[float, float], rows: int, columns: int) -> dict[str, float]:
    """:data:`IMAGE_MARGINS_IN` as ``Figure.subplots(gridspec_kw=...)`` fractions for a figure of
    ``size_in`` (inches): fixed, so saving the picture draws it once (no ``tight_layout``)."""
    return margins(size_in, rows, columns, IMAGE_MARGINS_IN)


@dataclass(frozen=True)
class ReportFigure:
    """One task picture: ``name`` is its file stem (letters, digits, ``_``), ``title`` a heading."""

    name: str
    title: str
    figure: Figure
    caption: str = ""


@runtime_checkable
class DrawsReportFigures(Protocol):
    """A LightningModule that draws pictures of its predictions for the run's report.

    ``report_figures`` runs once at the end of a fit, on global rank 0, with the model in eval
    mode and no grad; it should read only a few validation samples (``samples`` of each kind it
    shows, e.g. the best, the worst and random ones). The figures are saved as laid out, drawn
    once: give them fixed margins (:func:`image_grid_margins`), not ``tight_layout``.
    """

    def report_figures(self, trainer: L.Trainer, samples: int) -> list[ReportFigure]: ...


def save_task_figure(figure: ReportFigure, folder: Path, dpi: int = 110) -> Path:
    """Write ``figure`` as ``<folder>/task_<name>.png`` and return the path."""
    if not figure.name.replace("_", "").isalnum():
        raise ValueError(f"report figure names are letters, digits and '_', got {figure.name!r}")
    path = save_png(figure.figure, folder / f"{TASK_FIGURE_PREFIX}{figure.name}.png", dpi)
    # the caption travels with the picture, so `python -m vramkit.report` can show it again
    path.with_suffix(".txt").write_text(f"{figure.title}\n{figure.caption}\n")
    return path


def saved_task_figures(folder: Path) -> list[tuple[Path, str, str]]:
    """The task pictures saved in ``folder``: (png, title, caption), sorted by name."""
    found = []
    for png in sorted(folder.glob(f"{TASK_FIGURE_PREFIX}*.png")):
        text = png.with_suffix(".txt")
        lines = text.read_text().splitlines() if text.exists() else []
        title = lines[0] if lines else png.stem.removeprefix(TASK_FIGURE_PREFIX).replace("_", " ")
        found.append((png, title, "\n".join(lines[1:]).strip()))
    return found
