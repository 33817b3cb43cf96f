"""`vramkit` command-line mistakes: one line, exit 2, the closest valid name (no planning)."""

from __future__ import annotations

from vramkit.cli import main


def test_an_unknown_profile_names_the_closest(capsys):
    status = main(["plan", "--hw", "t44", "--model", "json:dumps", "--data", "json:loads"])
    error = capsys.readouterr().err
    assert status == 2 and error.count("\n") == 1
    assert "hw=t44: no such hardware profile; did you mean t4?" in error


def test_a_class_that_does_not_import_names_the_closest(capsys):
    status = main(["plan", "--hw", "t4", "--model", "json:dump", "--data", "json:JSONDecodr"])
    error = capsys.readouterr().err
    assert status == 2 and error.count("\n") == 1
    assert "json has no JSONDecodr; did you mean json:JSONDecoder?" in error


def test_an_unknown_command_names_the_closest(capsys):
    assert main(["plna"]) == 2
    assert "did you mean plan?" in capsys.readouterr().err
