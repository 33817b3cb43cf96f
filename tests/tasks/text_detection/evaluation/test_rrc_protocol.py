"""The official ICDAR 2015 protocol: a replay of the RRC script's rules against the fast path."""

from __future__ import annotations

import re
import subprocess
import sys

import numpy as np
import pytest

from tests.tasks.text_detection.rrc_reference import run_reference
from vramkit.tasks.text_detection.evaluation import rrc_files as rf
from vramkit.tasks.text_detection.evaluation.rrc_files import RrcRefusal, clockwise_sums
from vramkit.tasks.text_detection.evaluation.rrc_protocol import evaluate_entries

pytest.importorskip("Polygon", reason="the reference replays the script with Polygon3 (dev extra)")

METRICS = ("precision", "recall", "hmean", "matched", "gt_care", "det_care")
TRANSCRIPTIONS = ["word", "###", '"###"', " ###", "### ", '"### "', '"a,\\"b"', "x,y"]


def _quad(rng: np.random.Generator, near: np.ndarray | None) -> np.ndarray:
    """A quad on a small grid, so shared edges, exact ties and degenerate shapes are common."""
    if near is not None and rng.random() < 0.6:
        return near + rng.integers(-2, 3, (4, 2)) * (rng.random() < 0.7)
    x0, y0 = rng.integers(0, 30, 2)
    w, h = rng.integers(0, 14, 2)
    box = np.array([[x0, y0], [x0 + w, y0], [x0 + w, y0 + h], [x0, y0 + h]])
    kind = rng.integers(8)
    if kind == 0:
        return box[[0, 2, 1, 3]]  # bow-tie (area 0 when symmetric)
    if kind == 1:
        return np.array([[x0, y0], [x0 + w, y0 + h], [x0 + 2 * w, y0 + 2 * h], [x0 + w, y0 + h]])
    if kind == 2:
        return box[[0, 1, 2, 2]]  # a repeated point: a triangle
    if kind == 3:
        return rng.integers(0, 40, (4, 2))  # anything: darts, bow-ties, lines
    return box


def _clockwise(quad: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    if clockwise_sums(quad[None].astype(float))[0] > 0 and rng.random() < 0.97:
        return quad[::-1]
    return quad


def _line(quad: np.ndarray, rng: np.random.Generator) -> str:
    values = [str(int(v)) for v in quad.reshape(-1)]
    if rng.random() < 0.1:
        values = [f" {v} " for v in values]
    return ",".join(values)


def _random_case(rng: np.random.Generator) -> dict:
    confidences = bool(rng.random() < 0.2)
    gt_files, det_files = {}, {}
    for image in range(int(rng.integers(1, 5))):
        key = str(image + 1)
        gts = [_clockwise(_quad(rng, None), rng) for _ in range(rng.integers(0, 10))]
        lines = [
            f"{_line(q, rng)},{TRANSCRIPTIONS[rng.integers(len(TRANSCRIPTIONS))]}" for q in gts
        ]
        newline = "\r\n" if rng.random() < 0.2 else "\n"
        gt_files[key] = ("\ufeff" if rng.random() < 0.3 else "") + newline.join(lines)
        if rng.random() < 0.15:
            continue  # no submission file: no detections
        dets = []
        for _ in range(rng.integers(0, 10)):
            near = gts[rng.integers(len(gts))] if gts else None
            dets.append(_clockwise(_quad(rng, near), rng))
        det_lines = [_line(q, rng) for q in dets]
        if confidences:
            det_lines = [f"{line},{rng.integers(0, 10) / 10}" for line in det_lines]
        det_files[key] = "\n".join(det_lines) + ("\n" if rng.random() < 0.5 else "")
    return {"gt": gt_files, "subm": det_files, "confidences": confidences}


def _fast(case: dict) -> dict:
    try:
        result = evaluate_entries(
            {k: v.encode("utf-8") for k, v in case["gt"].items()},
            {k: v.encode("utf-8") for k, v in case["subm"].items()},
            confidences=case["confidences"],
        )
    except RrcRefusal as error:
        return {"refused": str(error)}
    keys = METRICS + (("AP",) if case["confidences"] else ())
    return {"ok": {key: result[key] for key in keys}}


def _refused_line(message: str) -> str:
    found = re.search(r"Line: (.*) Error: (\w+ \w+)", message)
    return found.groups() if found else message


@pytest.mark.parametrize("seed", [2015, 2016])
def test_replay_of_the_official_rules_on_random_degenerate_cases(seed: int) -> None:
    rng = np.random.default_rng(seed)
    cases = [_random_case(rng) for _ in range(150)]
    reference = run_reference(cases)
    compared = refused = crashed = differing = 0
    for case, expected in zip(cases, reference, strict=True):
        if expected.get("crashed"):
            crashed += 1  # the Polygon library crashed: the script gives no number to match
            continue
        got = _fast(case)
        if "refused" in expected:
            refused += 1
            assert "refused" in got, (case, expected, got)
            assert _refused_line(got["refused"]) == _refused_line(expected["refused"])
            continue
        compared += 1
        if got != expected:
            differing += 1
            print(case, expected, got)
    assert differing == 0
    assert compared >= 120 and refused >= 3 and crashed <= 10, (compared, refused, crashed)


def _evaluate(gt: dict[str, str], subm: dict[str, str], **options) -> dict:
    return evaluate_entries(
        {k: v.encode("utf-8") for k, v in gt.items()},
        {k: v.encode("utf-8") for k, v in subm.items()},
        **options,
    )


BOX = "0,0,10,0,10,10,0,10"  # clockwise in image axes (y down)


def test_a_bow_tie_with_area_zero_is_counted_and_can_be_matched() -> None:
    # Polygon's area() of a symmetric bow-tie is 0, its even-odd intersection with the box is
    # both lobes (50 px²): IoU = 50 / (100 + 0 - 50) = 1.
    result = _evaluate({"1": "0,0,10,10,10,0,0,10,word"}, {"1": BOX})
    assert (result["matched"], result["gt_care"], result["det_care"]) == (1, 1, 1)
    assert result["protocol"] == "official"


@pytest.mark.parametrize(
    ("text", "dont_care"),
    [
        ("###", True),
        ('"###"', True),
        (' "###" ', True),
        (" ###", False),
        ("### ", False),
        ('"### "', False),
        ("'###'", False),
    ],
)
def test_dont_care_is_exactly_three_hashes_after_stripping_quotes(text, dont_care) -> None:
    result = _evaluate({"1": f"{BOX},{text}"}, {})
    assert result["gt_care"] == (0 if dont_care else 1)


@pytest.mark.parametrize(
    ("line", "error"),
    [
        ("0,10,10,10,10,0,0,0", "Points are not clockwise"),
        ("0,0,10.5,0,10,10,0,10", "Format incorrect"),
        (BOX + ",0.9", "Format incorrect. Should be: x1,y1,x2,y2,x3,y3,x4,y4"),
    ],
)
def test_the_scripts_refusals_and_the_lenient_mode(line: str, error: str) -> None:
    gt, subm = {"1": f"{BOX},word"}, {"1": line}
    with pytest.raises(RrcRefusal, match=re.escape(f"Sample: 1 Line: {line} Error: {error}")):
        _evaluate(gt, subm)
    with pytest.warns(UserWarning, match="lenient: accepted 1 line"):
        result = _evaluate(gt, subm, lenient=True)
    assert result["matched"] == 1 and sum(result["lenient"].values()) == 1


def test_file_level_refusals() -> None:
    with pytest.raises(RrcRefusal, match="The sample 2 not present in GT"):
        _evaluate({"1": f"{BOX},word"}, {"2": BOX})
    with pytest.raises(RrcRefusal, match="Format incorrect"):
        _evaluate({"1": f"{BOX},word"}, {"1": BOX + ",0.9"}, confidences=False)
    result = _evaluate({"1": f"{BOX},word"}, {"1": BOX + ",0.9"}, confidences=True)
    assert result["AP"] == 1.0


def test_a_tie_exactly_at_the_threshold_is_decided_by_the_polygon_librarys_rounding() -> None:
    # IoU = (26/3) / (52/3) = 0.5 exactly; GPC's floats give 0.5000000000000001: a match.
    gt, subm = {"1": "20,11,26,11,26,13,20,13,word"}, {"1": "21,10,25,11,27,11,21,15"}
    exact = _evaluate(gt, subm, tie_breaker="exact")
    assert exact["matched"] == 0 and exact["threshold_ties"] == 1
    assert _evaluate(gt, subm, tie_breaker="polygon")["matched"] == 1


def test_a_tie_decided_by_the_library_leaves_the_evaluating_process_a_clean_exit() -> None:
    # Polygon3 aborts any process that imported it when that process exits (exit status 134).
    script = (
        "import sys\n"
        "from vramkit.tasks.text_detection.evaluation.rrc_protocol import evaluate_entries\n"
        "gt = {'1': b'20,11,26,11,26,13,20,13,word'}\n"
        "subm = {'1': b'21,10,25,11,27,11,21,15'}\n"
        "assert evaluate_entries(gt, subm, tie_breaker='polygon')['matched'] == 1\n"
        "assert 'Polygon' not in sys.modules\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Fatal Python error" not in done.stderr


FIELDS = ["0", "7", "-3", "12", "007", "-0", "1.5", " 4", "4 ", "", "-", "--2", "3-", "+1", "x"]


@pytest.mark.parametrize("ground_truth", [True, False])
def test_reading_all_lines_at_once_agrees_with_the_scripts_patterns(ground_truth: bool) -> None:
    # The byte-level fast path must accept exactly the lines the script's patterns accept (or
    # hand them over to the patterns), with the same numbers and don't-care flags.
    rng = np.random.default_rng(7)
    tails = [",word", ",###", ',"###"', ', "###" ', ",### ", ",a,b", ""] if ground_truth else [""]
    accepted = 0
    for _ in range(300):
        lines = []
        for _ in range(rng.integers(1, 4)):
            fields = [
                FIELDS[i] if rng.random() < 0.15 else str(rng.integers(-9, 99))
                for i in rng.integers(len(FIELDS), size=8)
            ]
            count = 8 + (rng.random() < 0.05) - (rng.random() < 0.05)
            lines.append(",".join(fields[:count]) + tails[rng.integers(len(tails))])
        text = "\n".join(lines) + ("\n\n" if rng.random() < 0.3 else "")
        at_once = rf._all_lines_at_once([text], ground_truth)
        kind = "gt" if ground_truth else "det"
        by_pattern = rf._fast_lines(text, kind)
        if at_once is None:
            continue
        accepted += 1
        assert by_pattern is not None, text
        joined, extra, _ = by_pattern
        values = np.array(joined.split(","), dtype=np.float64).reshape(-1, 4, 2)
        assert np.array_equal(at_once[0][0], values), text
        if ground_truth:
            expected = [rf.strip_quotes(t) == rf.DONT_CARE for t in extra]
            assert at_once[1][0].tolist() == expected, text
    assert accepted >= 30, accepted
