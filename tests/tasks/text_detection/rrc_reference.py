"""A slow, literal replay of the official ICDAR 2015 task 4.1 evaluation, for tests only.

Written from the algorithm of the RRC ``script.py`` + ``rrc_evaluation_funcs.py`` (default
parameters, Polygon library geometry): per-line regular expressions, the clockwise check, quote
stripping, then the script's loops over every ground-truth x detection pair with
``Polygon.Polygon`` objects. Nothing here is shared with vramkit's implementation.

The Polygon library (``pip install Polygon3``) crashes the process (segmentation fault in GPC)
on a few pairs of self-intersecting quads, as the official script would. So this runs as a
child process: ``python rrc_reference.py`` reads one JSON case per stdin line and prints one JSON
result per line; :func:`run_reference` restarts it after a crash and reports that case as
``{"crashed": true}``. ``python rrc_reference.py -g=gt.zip -s=submit.zip`` evaluates two zip
files as the script's command line does and prints its ``Calculated!{...}`` line
(``benchmarks/evaluation.py`` times it).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

_COORD = r"\s*(-?[0-9]+)\s*"
_EIGHT = ",".join([_COORD] * 8)
GT_LINE = r"^" + _EIGHT + r",(.*)$"
DET_LINE = r"^" + _EIGHT + r"$"
DET_CONFIDENCE_LINE = r"^" + _EIGHT + r",\s*([0-1].?[0-9]*)\s*$"


class Refused(Exception):
    pass


def decode(raw: bytes) -> str:
    text = raw.decode("utf-8", "replace").encode("utf-8")
    if text.startswith(b"\xef\xbb\xbf"):
        text = text.replace(b"\xef\xbb\xbf", b"", 1)
    return text.decode("utf-8")


def line_values(line: str, transcription: bool, confidence: bool):
    if transcription:
        m = re.match(GT_LINE, line)
        if m is None:
            raise Refused("Format incorrect. Should be: x1,y1,x2,y2,x3,y3,x4,y4,transcription")
    elif confidence:
        m = re.match(DET_CONFIDENCE_LINE, line)
        if m is None:
            raise Refused("Format incorrect. Should be: x1,y1,x2,y2,x3,y3,x4,y4,confidence")
    else:
        m = re.match(DET_LINE, line)
        if m is None:
            raise Refused("Format incorrect. Should be: x1,y1,x2,y2,x3,y3,x4,y4")
    points = [float(m.group(i)) for i in range(1, 9)]
    p = [[int(points[0]), int(points[1])], [int(points[2]), int(points[3])]]
    p += [[int(points[4]), int(points[5])], [int(points[6]), int(points[7])]]
    total = 0
    for i in range(4):
        j = (i + 1) % 4
        total += (p[j][0] - p[i][0]) * (p[j][1] + p[i][1])
    if total > 0:
        raise Refused("Points are not clockwise.")
    conf = 0.0
    if confidence:
        try:
            conf = float(m.group(9))
        except ValueError:
            raise Refused("Confidence value must be a float") from None
    text = ""
    if transcription:
        text = m.group(9)
        quoted = re.match(r'^\s*"(.*)"\s*$', text)
        if quoted is not None:
            text = quoted.group(1).replace("\\\\", "\\").replace('\\"', '"')
    return points, conf, text


def file_values(content: str, transcription: bool, confidence: bool):
    import numpy as np

    rows = []
    for line in content.split("\n"):
        line = line.replace("\r", "").replace("\n", "")
        if line != "":
            try:
                rows.append(line_values(line, transcription, confidence))
            except Refused as error:
                raise Refused(f"Line in sample not valid. Line: {line} Error: {error}") from None
    if confidence and rows:
        order = np.argsort(-np.array([row[1] for row in rows]))
        rows = [rows[i] for i in order]
    return rows


def evaluate(gt: dict, subm: dict, confidences: bool = False) -> dict:
    import numpy as np
    import Polygon as plg

    gt = {k: decode(v.encode("utf-8") if isinstance(v, str) else v) for k, v in gt.items()}
    subm = {k: decode(v.encode("utf-8") if isinstance(v, str) else v) for k, v in subm.items()}
    for k in gt:
        file_values(gt[k], True, False)
    for k in subm:
        if k not in gt:
            raise Refused(f"The sample {k} not present in GT")
        file_values(subm[k], False, confidences)

    def polygon(points):
        box = np.empty([1, 8], dtype="int32")
        for i in range(4):
            box[0, i] = int(points[2 * i])
            box[0, 4 + i] = int(points[2 * i + 1])
        return plg.Polygon(box[0].reshape([2, 4]).T)

    def intersection(a, b):
        both = a & b
        return 0 if len(both) == 0 else both.area()

    def iou(d, g):
        try:
            return intersection(d, g) / (d.area() + g.area() - intersection(d, g))
        except ZeroDivisionError:
            return 0

    matched_sum = care_gt_sum = care_det_sum = 0
    all_conf, all_match = [], []
    per_sample = {}
    for key in gt:
        gt_rows = file_values(gt[key], True, False)
        gt_pols = [polygon(points) for points, _, _ in gt_rows]
        gt_points = [points for points, _, _ in gt_rows]
        dont_care = [n for n, row in enumerate(gt_rows) if row[2] == "###"]
        log = f"GT polygons: {len(gt_pols)}\n"
        det_pols, det_points, det_dont_care, det_conf, matched_dets, pairs = [], [], [], [], [], []
        matrix = np.empty([1, 1])
        matched = 0
        if key in subm:
            for points, conf, _ in file_values(subm[key], False, confidences):
                det = polygon(points)
                det_pols.append(det)
                det_points.append(points)
                det_conf.append(conf)
                for n in dont_care:
                    area = det.area()
                    precision = 0 if area == 0 else intersection(gt_pols[n], det) / area
                    if precision > 0.5:
                        det_dont_care.append(len(det_pols) - 1)
                        break
            log += f"DET polygons: {len(det_pols)}\n"
            if gt_pols and det_pols:
                matrix = np.empty([len(gt_pols), len(det_pols)])
                gt_taken = np.zeros(len(gt_pols), np.int8)
                det_taken = np.zeros(len(det_pols), np.int8)
                for g in range(len(gt_pols)):
                    for d in range(len(det_pols)):
                        matrix[g, d] = iou(det_pols[d], gt_pols[g])
                for g in range(len(gt_pols)):
                    for d in range(len(det_pols)):
                        if (
                            gt_taken[g] == 0
                            and det_taken[d] == 0
                            and g not in dont_care
                            and d not in det_dont_care
                            and matrix[g, d] > 0.5
                        ):
                            gt_taken[g] = det_taken[d] = 1
                            matched += 1
                            pairs.append({"gt": g, "det": d})
                            matched_dets.append(d)
                            log += f"Match GT #{g} with Det #{d}\n"
            if confidences:
                for d in range(len(det_pols)):
                    if d not in det_dont_care:
                        all_conf.append(det_conf[d])
                        all_match.append(d in matched_dets)
        # The script keeps these per-sample results (the IoU matrix up to 100 detections).
        per_sample[key] = {
            "pairs": pairs,
            "iouMat": [] if len(det_pols) > 100 else matrix.tolist(),
            "gtPolPoints": gt_points,
            "detPolPoints": det_points,
            "gtDontCare": dont_care,
            "detDontCare": det_dont_care,
            "evaluationLog": log,
        }
        matched_sum += matched
        care_gt_sum += len(gt_pols) - len(dont_care)
        care_det_sum += len(det_pols) - len(det_dont_care)
    recall = 0 if care_gt_sum == 0 else float(matched_sum) / care_gt_sum
    precision = 0 if care_det_sum == 0 else float(matched_sum) / care_det_sum
    hmean = 0 if recall + precision == 0 else 2 * recall * precision / (recall + precision)
    result = {"precision": precision, "recall": recall, "hmean": hmean, "matched": matched_sum}
    result.update(gt_care=care_gt_sum, det_care=care_det_sum)
    if confidences:
        ap, correct = 0, 0
        if all_conf:
            order = np.argsort(-np.array(all_conf))
            ranked = np.array(all_match)[order]
            for n in range(len(ranked)):
                if ranked[n]:
                    correct += 1
                    ap += float(correct) / (n + 1)
            if care_gt_sum > 0:
                ap /= care_gt_sum
        result["AP"] = ap
    return result


def run_reference(cases: list[dict], timeout: float = 300.0) -> list[dict]:
    """Evaluate ``cases`` ({"gt": {key: text}, "subm": {...}, "confidences": bool}) in a child."""
    results: list[dict] = []
    while len(results) < len(cases):
        remaining = cases[len(results) :]
        payload = "".join(json.dumps(case) + "\n" for case in remaining)
        done = subprocess.run(
            [sys.executable, str(Path(__file__).resolve())],
            input=payload,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        lines = done.stdout.splitlines()
        results.extend(json.loads(line) for line in lines)
        if done.returncode != 0 and len(results) < len(cases):
            if done.returncode > 0 and "Traceback" in done.stderr:
                raise RuntimeError(done.stderr)
            results.append({"crashed": True})
    return results


def load_zip(path: str, pattern: str, all_entries: bool) -> dict:
    import zipfile

    archive = zipfile.ZipFile(path, mode="r", allowZip64=True)
    pairs = []
    for name in archive.namelist():
        m = re.match(pattern, name)
        if m is None:
            if all_entries:
                raise Refused(f"ZIP entry not valid: {name}")
            continue
        pairs.append([m.group(1) if m.groups() else name, archive.read(name)])
    return dict(pairs)


def _command_line(arguments: list[str]) -> None:
    options = dict(argument[1:].split("=", 1) for argument in arguments)
    gt = load_zip(options["g"], r"gt_img_([0-9]+).txt", False)
    subm = load_zip(options["s"], r"res_img_([0-9]+).txt", True)
    sys.stdout.write("Calculated!" + json.dumps(evaluate(gt, subm)) + "\n")


def _serve() -> None:
    for line in sys.stdin:
        case = json.loads(line)
        try:
            out = {"ok": evaluate(case["gt"], case["subm"], case.get("confidences", False))}
        except Refused as error:
            out = {"refused": str(error)}
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    if len(sys.argv) > 1:
        _command_line(sys.argv[1:])
    else:
        _serve()
