"""The evaluate command line: zips or folders, both protocols, refusals."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest

from vramkit.tasks.text_detection.evaluation.evaluate import main
from vramkit.tasks.text_detection.evaluation.rrc_files import (
    SUBMISSION_NAME,
    RrcRefusal,
    read_entries,
)

GT = {
    "gt_img_1.txt": "\ufeff0,0,10,0,10,10,0,10,word\r\n0,0,10,10,10,0,0,10,bow\r\n",
    "gt_img_2.txt": '20,20,30,20,30,30,20,30,"###"\n',
}
SUBMISSION = {"res_img_1.txt": "0,0,10,0,10,10,0,10\n0,0,10,10,10,0,0,10\n"}


def _zip(path: Path, files: dict[str, str]) -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        for name, text in files.items():
            archive.writestr(name, text)
    return path


def _folder(path: Path, files: dict[str, str]) -> Path:
    path.mkdir()
    for name, text in files.items():
        (path / name).write_text(text, encoding="utf-8")
    return path


def _run(capsys, *args: str) -> tuple[int, dict | None, str]:
    status = main([str(arg) for arg in args])
    out, err = capsys.readouterr()
    return status, (json.loads(out) if out.strip() else None), err


def test_zips_and_folders_give_the_same_official_numbers(tmp_path, capsys) -> None:
    gt_zip, sub_zip = _zip(tmp_path / "gt.zip", GT), _zip(tmp_path / "s.zip", SUBMISSION)
    status, zipped, _ = _run(capsys, gt_zip, sub_zip)
    assert status == 0 and zipped["protocol"] == "official"
    # The bow-tie counts as care ground truth. The box matches the box; the bow-tie detection
    # cannot match the bow-tie: both areas are 0, so the union 0 + 0 - 50 is negative.
    assert (zipped["matched"], zipped["gt_care"], zipped["det_care"]) == (1, 2, 2)
    gt_dir, sub_dir = _folder(tmp_path / "gt", GT), _folder(tmp_path / "s", SUBMISSION)
    status, folder, _ = _run(capsys, gt_dir, sub_dir)
    assert status == 0 and folder == zipped


def test_db_protocol_skips_the_bow_tie_and_says_so(tmp_path, capsys) -> None:
    gt_zip, sub_zip = _zip(tmp_path / "gt.zip", GT), _zip(tmp_path / "s.zip", SUBMISSION)
    status, result, _ = _run(capsys, gt_zip, sub_zip, "--protocol", "db")
    assert status == 0 and result["protocol"] == "db"
    # The bow-tie is skipped; the DB reader trims spaces but keeps quotes, so '"###"' is care.
    assert (result["matched"], result["gt_care"], result["invalid_gt"]) == (1, 2, 1)


def test_refusal_exits_2_with_the_scripts_reason(tmp_path, capsys) -> None:
    bad = _zip(tmp_path / "s.zip", {**SUBMISSION, "notes.txt": "hello"})
    status, result, err = _run(capsys, _zip(tmp_path / "gt.zip", GT), bad)
    assert status == 2 and result is None
    assert "ZIP entry not valid: notes.txt" in err


def test_submission_entries_must_match_the_scripts_names(tmp_path) -> None:
    folder = _folder(tmp_path / "s", {"res_1.txt": ""})
    with pytest.raises(RrcRefusal, match=r"ZIP entry not valid: res_1\.txt"):
        read_entries(folder, SUBMISSION_NAME, all_entries=True)
