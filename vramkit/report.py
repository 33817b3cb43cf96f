"""``python -m vramkit.report RUN_DIR``: rebuild a run's report.html from its run folder.

Reads the CSV logger's metrics.csv, memory_plan.json (when the run planned its batch sizes),
resolved_config.yaml and the task pictures saved under RUN_DIR/report/ at the end of the fit.
Exit status: 0 when the report was written, 2 when RUN_DIR is not a run folder.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from vramkit.core.report import build_report
from vramkit.core.report.run_metrics import find_metrics_csv


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0].strip("`"))
    parser.add_argument(
        "run_dir", type=Path, help="a run folder (the one holding csv/, checkpoints/)"
    )
    args = parser.parse_args(argv)
    run_dir: Path = args.run_dir
    if not run_dir.is_dir():
        print(f"report: {run_dir} is not a folder", file=sys.stderr)
        return 2
    if find_metrics_csv(run_dir) is None and not (run_dir / "resolved_config.yaml").exists():
        print(
            f"report: {run_dir} holds neither a metrics.csv nor a resolved_config.yaml: "
            "not a run folder",
            file=sys.stderr,
        )
        return 2
    print(build_report(run_dir))
    return 0


if __name__ == "__main__":
    sys.exit(main())
