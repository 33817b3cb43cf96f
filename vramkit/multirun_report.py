"""``python -m vramkit.multirun_report SWEEP_DIR``: metrics per condition, mean ± spread over seeds.

SWEEP_DIR is a multirun folder (``logs/<task>/multiruns/<time>``). Jobs whose overrides differ
only in ``--across`` (default ``seed``) form one condition; each metric is the last value the job
logged. Prints the table and writes ``multirun_report.json`` into SWEEP_DIR. Exit status 2 when
the folder holds no jobs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from vramkit.core.run.records.multirun_report import render_report, report_multirun, write_report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0].strip("`"))
    parser.add_argument("sweep_dir", type=Path, help="a multirun folder")
    parser.add_argument(
        "--metrics", nargs="+", default=None, help="metric names (default: every val/ metric)"
    )
    parser.add_argument("--across", default="seed", help="the override the spread is over")
    args = parser.parse_args(argv)
    try:
        report = report_multirun(args.sweep_dir, metrics=args.metrics, across=args.across)
    except FileNotFoundError as error:
        print(f"multirun_report: {error}", file=sys.stderr)
        return 2
    print(render_report(report))
    print(f"written: {write_report(report, args.sweep_dir)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
