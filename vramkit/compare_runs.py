"""``python -m vramkit.compare_runs RUN_A RUN_B``: which differences between runs change training.

RUN_A and RUN_B are run folders (or checkpoints inside them). Prints the overrides only one run
has (their `overrides.txt`), the config differences, each marked as changing training or not,
the code and environment differences, and a one-line verdict.
Exit status: 0 when no difference changes training, 1 when one does, 2 when a run cannot be read.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from vramkit.core.run.records.run_diff import compare, load_overrides, load_run, report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0].strip("`"))
    parser.add_argument("run_a", type=Path, help="a run folder or a checkpoint in one")
    parser.add_argument("run_b", type=Path, help="the run to compare it with")
    args = parser.parse_args(argv)
    try:
        config_a, record_a = load_run(args.run_a)
        config_b, record_b = load_run(args.run_b)
        overrides = (load_overrides(args.run_a), load_overrides(args.run_b))
    except (FileNotFoundError, ValueError) as error:
        print(f"compare_runs: {error}", file=sys.stderr)
        return 2
    comparison = compare(config_a, config_b, (record_a, record_b), overrides)
    print(report(comparison, (str(args.run_a), str(args.run_b))))
    return 0 if comparison.equivalent else 1


if __name__ == "__main__":
    sys.exit(main())
