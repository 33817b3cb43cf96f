"""`vramkit plan` imports what it plans with under `long_lived_imports`, freezing only in a
process of its own (an in-process caller's garbage must stay collectable)."""

from __future__ import annotations

import builtins
import contextlib

import pytest

from vramkit import cli
from vramkit.core.run import long_lived_imports as imports_module


def test_only_the_console_script_freezes(monkeypatch):
    seen = []
    monkeypatch.setattr(cli, "plan_command", lambda argv, *, own_process: seen.append(own_process))
    monkeypatch.setattr("sys.argv", ["vramkit", "plan", "--hw", "t4"])
    cli.main()
    cli.main(["plan", "--hw", "t4"])
    assert seen == [True, False]


@pytest.mark.parametrize(
    ("argv", "own_process", "peft"),
    [
        (["--hf", "gpt2", "--qlora"], True, True),
        (["--hf", "gpt2", "--lora-r", "8"], False, True),
        (["--hf", "gpt2", "--full"], True, False),
        (["--hf", "gpt2"], True, False),
    ],
)
def test_imports_run_with_the_collector_paused(monkeypatch, argv, own_process, peft):
    freezes, imported = [], []
    real_import = builtins.__import__

    @contextlib.contextmanager
    def recording(*, freeze):
        freezes.append(freeze)
        monkeypatch.setattr(builtins, "__import__", recording_import)
        try:
            yield
        finally:
            monkeypatch.setattr(builtins, "__import__", real_import)

    def recording_import(name, *args, **kwargs):
        imported.append(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(imports_module, "long_lived_imports", recording)
    args = cli._plan_parser().parse_args(["--hw", "t4", *argv])
    cli._planning_imports(args, own_process=own_process)
    assert freezes == [own_process]
    assert "transformers" in imported and "lightning.pytorch" in imported
    assert ("peft" in imported) is peft
