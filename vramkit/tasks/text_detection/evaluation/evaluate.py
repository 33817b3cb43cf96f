"""``python -m vramkit.tasks.text_detection.evaluation.evaluate GT SUBMISSION``: ICDAR 2015 scores
as JSON.

``GT`` and ``SUBMISSION`` are zip files (as the RRC site takes them) or folders of
``gt_img_N.txt`` / ``res_img_N.txt`` files. Two protocols:

- ``--protocol official`` (the default): the numbers of the official RRC ``script.py`` with its
  default parameters, on every input it accepts (see :mod:`rrc_protocol`). Input it refuses is
  refused with its message (exit status 2), unless ``--lenient`` accepts it with a warning.
  ``--confidences`` is the script's ``CONFIDENCES=True``: a confidence column is required and
  ``AP`` is reported.
- ``--protocol db``: DBNet's shapely-port rules (:mod:`icdar_eval`), for comparison with
  DB-style papers: invalid polygons skipped, transcriptions trimmed, confidence column allowed.

The JSON line always names the protocol that ran.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path

from vramkit.tasks.text_detection.evaluation.rrc_files import RrcRefusal
from vramkit.tasks.text_detection.evaluation.rrc_protocol import evaluate_official

PROTOCOLS = ("official", "db")


def _as_folder(location: Path, scratch: Path, role: str) -> Path:
    import zipfile

    if location.is_dir():
        return location
    if not location.is_file():
        raise FileNotFoundError(f"{role}: {location} is neither a zip file nor a folder")
    target = scratch / role
    with zipfile.ZipFile(location) as archive:
        archive.extractall(target)
    return target


def evaluate_db(gt_location: Path, submission_location: Path, *, strict: bool = False) -> dict:
    """DBNet-style scores (invalid polygons skipped) of zips or folders; see :mod:`icdar_eval`."""
    import tempfile

    from vramkit.tasks.text_detection.evaluation.icdar_eval import evaluate_folders

    with tempfile.TemporaryDirectory() as scratch:
        gt_dir = _as_folder(gt_location, Path(scratch), "gt")
        submission_dir = _as_folder(submission_location, Path(scratch), "submission")
        return {"protocol": "db", **evaluate_folders(gt_dir, submission_dir, strict=strict)}


def evaluate(
    gt_location: str | Path,
    submission_location: str | Path,
    *,
    protocol: str = "official",
    lenient: bool = False,
    confidences: bool = False,
    strict: bool = False,
    tie_breaker: str = "auto",
) -> dict:
    """Scores of a submission under ``protocol`` (``official`` or ``db``), with its name."""
    if protocol not in PROTOCOLS:
        raise ValueError(f"protocol {protocol!r}: expected one of {', '.join(PROTOCOLS)}")
    if protocol == "db":
        return evaluate_db(Path(gt_location), Path(submission_location), strict=strict)
    return evaluate_official(
        gt_location,
        submission_location,
        confidences=confidences,
        lenient=lenient,
        tie_breaker=tie_breaker,
    )


def _keep_freed_memory() -> None:
    """Let glibc keep freed memory for reuse instead of handing it back to the system.

    The evaluation's numpy temporaries (a few MB each) are otherwise unmapped when freed and
    faulted in again on the next allocation: on a 500-image submission that was 39k page faults
    and a fifth of the command's CPU time. ``mallopt`` (glibc, ``man 3 mallopt``): raise
    ``M_MMAP_THRESHOLD`` (-3) to its 32 MiB maximum on 64-bit and ``M_TRIM_THRESHOLD`` (-1).
    Elsewhere (no glibc) nothing changes.
    """
    import ctypes

    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return
    mallopt(-3, 32 * 2**20)
    mallopt(-1, 256 * 2**20)


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point: one JSON line on stdout; a refusal exits with status 2."""
    _keep_freed_memory()
    parser = argparse.ArgumentParser(
        prog="python -m vramkit.tasks.text_detection.evaluation.evaluate",
        description="ICDAR 2015 text localisation scores (official RRC script or DB protocol).",
    )
    parser.add_argument("gt", type=Path, help="ground truth: zip or folder of gt_img_N.txt")
    parser.add_argument("submission", type=Path, help="zip or folder of res_img_N.txt")
    parser.add_argument(
        "--protocol", choices=PROTOCOLS, default="official", help="official (default) or db"
    )
    parser.add_argument(
        "--lenient",
        action="store_true",
        help="official: accept counter-clockwise and non-integer points and an unexpected "
        "confidence column, with a warning, instead of refusing them as the script does",
    )
    parser.add_argument(
        "--confidences",
        action="store_true",
        help="official: the script's CONFIDENCES=True (confidence column required, AP reported)",
    )
    parser.add_argument(
        "--tie-breaker",
        choices=("auto", "polygon", "exact"),
        default="auto",
        help="official: pairs exactly on a threshold are decided by the Polygon library's "
        "rounding, as the script does (polygon; needs Polygon3), or exactly (exact); auto picks "
        "polygon when Polygon3 is installed",
    )
    parser.add_argument(
        "--strict", action="store_true", help="db: fail on the first malformed line or stray file"
    )
    args = parser.parse_args(argv)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            result = evaluate(
                args.gt,
                args.submission,
                protocol=args.protocol,
                lenient=args.lenient,
                confidences=args.confidences,
                strict=args.strict,
                tie_breaker=args.tie_breaker,
            )
    except (RrcRefusal, FileNotFoundError, ValueError, ImportError) as error:
        print(f"error ({args.protocol} protocol): {error}", file=sys.stderr)
        return 2
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
