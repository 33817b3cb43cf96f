"""`vramkit plan` imports what it plans with under `long_lived_imports`, freezing only in a
process of its own (an in-process caller's garbage must stay collectable), and never imports a
heavy library that a plan does not run."""

from __future__ import annotations

import builtins
import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from vramkit import cli
from vramkit.core.run import long_lived_imports as imports_module

REPO = Path(__file__).resolve().parents[1]
NEVER_IMPORTED = (
    "bitsandbytes",  # peft's optional import: its torch.compile calls load torch._inductor
    "torch._inductor.compile_fx",  # nn.Module.compile under profile.compile (undone anyway)
    "albumentations",
    "cv2",
    "deepspeed",
    "onnx",
    "onnxruntime",
    "optuna",
    "pandas",
    "sklearn",
    "tensorboard",
    "wandb",
    "vramkit.core.trainer_assembly",
    "vramkit.tasks.text_detection",
    "vramkit.tasks.sage",
    "vramkit.tasks.text_classification",
)
"""Modules a `vramkit plan --hf` QLoRA plan has no use for: the first two cost 1.2-1.5 s and
0.7-0.9 s of CPU (two loaded cores), the rest are the run's and the other tasks' libraries."""
_PLAN_THEN_LIST_MODULES = """
import json, sys
from vramkit import cli
sys.argv = ["vramkit", *sys.argv[1:]]
status = cli.main()
print(json.dumps({"status": status, "modules": sorted(n for n, m in sys.modules.items() if m)}))
"""


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
    monkeypatch.setattr(cli, "keep_unloaded", lambda: None)  # this process is the test session
    args = cli._plan_parser().parse_args(["--hw", "t4", *argv])
    cli._planning_imports(args, own_process=own_process)
    assert freezes == [own_process]
    assert "transformers" in imported and "lightning.pytorch" in imported
    assert ("peft" in imported) is peft


@pytest.mark.parametrize(
    ("argv", "own_process", "kept"),
    [
        (["--hf", "gpt2", "--qlora"], True, True),
        (["--hf", "gpt2", "--qlora", "--verify"], True, False),  # its real model may need them
        (["--hf", "gpt2", "--qlora"], False, False),  # peft would remember them as absent
        (["--model", "a:B", "--data", "a:C"], True, False),  # the user's code may import them
    ],
)
def test_only_a_plan_process_of_its_own_keeps_libraries_unloaded(
    monkeypatch, argv, own_process, kept
):
    calls = []
    monkeypatch.setattr(cli, "keep_unloaded", lambda: calls.append(True))
    monkeypatch.setattr(
        imports_module, "long_lived_imports", lambda *, freeze: contextlib.nullcontext()
    )
    args = cli._plan_parser().parse_args(["--hw", "t4", *argv])
    cli._planning_imports(args, own_process=own_process)
    assert bool(calls) is kept


@pytest.mark.slow
def test_an_hf_qlora_plan_imports_no_library_it_does_not_run(tmp_path):
    # A two-layer Llama: the process's imports are the plan's, the trace takes a moment.
    config = {
        "model_type": "llama",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 256,
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    argv = ["plan", "--hf", str(tmp_path / "config.json"), "--qlora", "--seq-len", "32"]
    argv += ["--hw", "rtx4090_laptop", "--batch-size", "1", "--val-batch-size", "1", "--json"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-c", _PLAN_THEN_LIST_MODULES, *argv],
        cwd=tmp_path,  # as the installed command runs: outside the checkout
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    listing = json.loads(done.stdout.strip().splitlines()[-1])
    assert listing["status"] == 0, done.stderr
    modules = set(listing["modules"])
    # The plan ran: the model's code and peft's LoRA (rtx4090_laptop asks for torch.compile).
    assert {"transformers.models.llama.modeling_llama", "peft.tuners.lora"} <= modules
    heavy = [name for name in NEVER_IMPORTED if name in modules]
    assert heavy == [], f"vramkit plan --hf imported {heavy}"
