"""Pictures of a run: curves from its metrics, task figures, and the report.html that holds them."""

from vramkit.core.report.build import REPORT_DIR, REPORT_NAME, build_report
from vramkit.core.report.task_figures import DrawsReportFigures, ReportFigure

__all__ = ["REPORT_DIR", "REPORT_NAME", "DrawsReportFigures", "ReportFigure", "build_report"]
