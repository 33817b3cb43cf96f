"""``python -m vramkit.report RUN_DIR`` rebuilds report.html from the folder alone."""

from __future__ import annotations

from fake_run_folder import write_fake_run

from vramkit import report


def test_the_command_rebuilds_the_report_with_the_saved_task_pictures(tmp_path, capsys):
    run = write_fake_run(tmp_path / "run")
    assert report.main([str(run)]) == 0
    assert capsys.readouterr().out.strip() == str(run / "report.html")
    html = (run / "report.html").read_text()
    assert "report/task_checker.png" in html  # drawn at the end of the fit, shown again
    assert (run / "report" / "loss.png").stat().st_size > 1000


def test_a_folder_that_is_no_run_is_refused(tmp_path, capsys):
    assert report.main([str(tmp_path)]) == 2
    assert "not a run folder" in capsys.readouterr().err
    assert not (tmp_path / "report.html").exists()
    assert report.main([str(tmp_path / "missing")]) == 2
