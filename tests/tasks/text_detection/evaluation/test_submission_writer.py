"""``eval.py``'s submission files pass the official script's format rules as they are."""

from __future__ import annotations

import zipfile
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from tests.tasks.text_detection.rrc_reference import Refused, file_values
from vramkit.tasks.text_detection.evaluation.rrc_protocol import evaluate_official
from vramkit.tasks.text_detection.evaluation.submission_writer import (
    IcdarSubmissionWriter,
    submission_quad,
)

# Counter-clockwise in image axes, non-integer, and one that rounds to a degenerate quad.
BOXES = [
    np.array([[10.4, 10.6], [10.2, 40.1], [90.7, 40.3], [90.2, 10.2]]),
    np.array([[100.0, 5.0], [160.0, 5.0], [160.0, 25.0], [100.0, 25.0]]),
    np.array([[3.4, 3.4], [3.6, 3.4], [3.6, 3.6], [3.4, 3.6]]),
]


def _write(tmp_path: Path, with_confidences: bool) -> IcdarSubmissionWriter:
    writer = IcdarSubmissionWriter(tmp_path / "predictions", with_confidences=with_confidences)
    trainer = SimpleNamespace(is_global_zero=True)
    writer.on_predict_start(trainer, None)
    scores = [[0.9, 1.2, 0.3], []]
    prediction = {"names": ["img_1", "img_2"], "boxes": [BOXES, []], "scores": scores}
    writer.write_on_batch_end(trainer, None, prediction, None, None, 0, 0)
    writer.on_predict_end(trainer, None)
    return writer


def test_default_files_pass_the_official_rules_without_a_confidence_column(tmp_path) -> None:
    writer = _write(tmp_path, with_confidences=False)
    with zipfile.ZipFile(writer.zip_path) as archive:
        assert sorted(archive.namelist()) == ["res_img_1.txt", "res_img_2.txt"]
        content = archive.read("res_img_1.txt").decode("utf-8")
    rows = file_values(content, transcription=False, confidence=False)  # raises if refused
    assert len(rows) == 3
    # The first box came counter-clockwise: its order is reversed, its points rounded.
    assert content.splitlines()[0] == "90,10,91,40,10,40,10,11"
    with pytest.raises(Refused, match="Format incorrect"):
        file_values(content, transcription=False, confidence=True)


def test_confidences_only_when_asked_and_in_the_scripts_pattern(tmp_path) -> None:
    writer = _write(tmp_path, with_confidences=True)
    content = (writer.output_dir / "res_img_1.txt").read_text(encoding="utf-8")
    rows = file_values(content, transcription=False, confidence=True)
    assert sorted(conf for _, conf, _ in rows) == [0.3, 0.9, 1.0]  # clamped to [0, 1]
    with pytest.raises(Refused, match="Format incorrect"):
        file_values(content, transcription=False, confidence=False)


def test_written_zip_is_scored_by_the_official_protocol(tmp_path) -> None:
    writer = _write(tmp_path, with_confidences=False)
    gt = tmp_path / "gt"
    gt.mkdir()
    (gt / "gt_img_1.txt").write_text("10,11,91,10,90,40,10,40,word\n", encoding="utf-8")
    (gt / "gt_img_2.txt").write_text("", encoding="utf-8")
    result = evaluate_official(gt, writer.zip_path)
    assert (result["matched"], result["gt_care"], result["det_care"]) == (1, 1, 3)


def test_submission_quad_is_clockwise_after_rounding() -> None:
    sliver = np.array([[0.0, 0.0], [0.4, 10.0], [0.6, 10.0], [0.2, 0.0]])
    quad = submission_quad(sliver)
    x, y = quad[:, 0], quad[:, 1]
    assert ((np.roll(x, -1) - x) * (np.roll(y, -1) + y)).sum() <= 0
    assert quad.dtype == np.int64
