"""The installed `vramkit` command is whole: `--model` imports from the current folder as
`python -m` does, and a missing optional extra is one line naming it, exit 2, no run folder."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from vramkit.cli import import_object, main
from vramkit.core.optional_dependency import MissingExtraError, import_optional
from vramkit.core.run.settling.compose import forget_composition

PACKAGE = "vramkit_cwd_package_for_a_test"


@pytest.fixture
def without_transformers(monkeypatch):
    """`import transformers` fails as if it were not installed (None in sys.modules).

    Lightning is imported first: torchmetrics, which it imports, asks the package metadata
    (still there) whether transformers is installed and would then stumble on the None.
    """
    import lightning  # noqa: F401

    for name in [name for name in sys.modules if name.split(".")[0] == "transformers"]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "transformers", None)


def test_model_imports_from_the_current_folder(tmp_path, monkeypatch):
    package = tmp_path / PACKAGE
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "mod.py").write_text("class MyModule:\n    pass\n")
    monkeypatch.chdir(tmp_path)
    # A console script's path starts with its own folder, not the current one.
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    try:
        found = import_object(f"{PACKAGE}.mod:MyModule", "--model")
    finally:
        for name in [name for name in sys.modules if name.startswith(PACKAGE)]:
            del sys.modules[name]
    assert found.__name__ == "MyModule" and sys.path[0] == str(tmp_path)


def test_a_missing_extra_is_a_refusal_naming_the_install(without_transformers):
    with pytest.raises(MissingExtraError, match=r"pip install 'vramkit\[nlp\]'"):
        import_optional("transformers", extra="nlp", purpose="task=causal_lm")


def test_plan_hf_without_transformers_is_one_line(capsys, without_transformers):
    assert main(["plan", "--hw", "t4", "--hf", "gpt2", "--qlora"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert "--hf gpt2:" in line and "pip install 'vramkit[nlp]'" in line


def test_train_without_transformers_is_one_line_and_leaves_no_run_folder(
    capsys, tmp_path, without_transformers
):
    logs = tmp_path / "logs"
    try:
        status = main(
            ["train", "experiment=phi15_coherence_tiny", "+hw=cpu", f"paths.log_dir={logs}"]
        )
    finally:
        forget_composition()
    (line,) = capsys.readouterr().err.splitlines()
    assert status == 2
    assert line.startswith("error: task=text_classification needs the optional package")
    assert "pip install 'vramkit[nlp]'" in line
    assert not any(path.is_file() for path in Path(logs).rglob("*"))
