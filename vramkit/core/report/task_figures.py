"""The hook through which a task adds its own pictures to a run's report (core imports no task)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from matplotlib.figure import Figure

if TYPE_CHECKING:
    import lightning as L

TASK_FIGURE_PREFIX = "task_"
"""Task pictures are saved as ``report/task_<name>.png``, so a rebuild finds them again."""


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
    shows, e.g. the best, the worst and random ones).
    """

    def report_figures(self, trainer: L.Trainer, samples: int) -> list[ReportFigure]: ...


def save_task_figure(figure: ReportFigure, folder: Path, dpi: int = 110) -> Path:
    """Write ``figure`` as ``<folder>/task_<name>.png`` and return the path."""
    if not figure.name.replace("_", "").isalnum():
        raise ValueError(f"report figure names are letters, digits and '_', got {figure.name!r}")
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{TASK_FIGURE_PREFIX}{figure.name}.png"
    figure.figure.savefig(path, dpi=dpi, bbox_inches="tight")
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
