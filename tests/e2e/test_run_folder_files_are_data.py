"""A run folder's records are data: eval reads a checkpoint's ``.hydra/config.yaml`` without
resolving anything in it, so an edited ``task_name: ${run_folder:<path>}`` creates no folder."""

from __future__ import annotations

import torch

from tests.e2e.entry_points import run_entry_point


def test_eval_resolves_nothing_in_the_checkpoints_run_folder(monkeypatch, capsys, tmp_path):
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / ".hydra").mkdir()
    (run / "resolved_config.yaml").write_text("task_name: text_detection\n")
    anywhere = tmp_path / "anywhere"
    (run / ".hydra" / "config.yaml").write_text(f"task_name: ${{run_folder:{anywhere}}}\n")
    torch.save({"state_dict": {}}, run / "checkpoints" / "last.ckpt")
    logs = tmp_path / "logs"
    code, err = run_entry_point(
        monkeypatch,
        capsys,
        "eval.py",
        "+hw=cpu",
        f"paths.log_dir={logs}",
        f"ckpt_path={run / 'checkpoints' / 'last.ckpt'}",
    )
    assert code == 2, err
    assert "a checkpoint of task ${run_folder:" in err and "Traceback" not in err, err
    assert not anywhere.exists(), "a resolver read from a run folder created a folder"
    assert not logs.exists()
