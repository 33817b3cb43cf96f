"""`scripts/run_route.py`: the route of one run from train.py to the fit, counted as issue #35
asks (at most 15 of the run's own files, the config composed at most twice)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "run_route.py"
SMALL = ("data.synthetic.image_size=128", "data.image_size=128", "data.val_image_size=128")
"""Smaller images: the same route, a cheaper host-memory plan."""

_spec = importlib.util.spec_from_file_location("run_route_script", SCRIPT)
run_route = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = run_route  # its dataclasses look their module up there
_spec.loader.exec_module(run_route)
Visit, Route = run_route.Visit, run_route.Route


def _route(root: Visit) -> Route:
    return Route(root, compositions=2, mode_probes=1, reached_fit=True)


def test_a_return_is_no_reentry_but_a_second_call_into_a_file_left_is():
    settle = Visit("settle.py", "settle", [Visit("plan.py", "plan", [Visit("x.py", "f")])])
    again = Visit("settle.py", "settled_config", [Visit("compose.py", "compose_run")])
    root = Visit("train.py", "<module>", [Visit("run.py", "train", [settle, again])])
    route = _route(root)
    assert route.files() == ["train.py", "run.py", "settle.py", "plan.py"]
    assert route.reentries() == ["settle.py:settled_config"]
    assert route.left_out(utility=False) == ["compose.py", "x.py"]  # entered nothing further


def test_utility_calls_and_leaves_are_left_out_but_the_planner_counts_as_one():
    planner = Visit(run_route.PLANNER, "plan_task")  # its inside folded: no children, no leaf
    settings = Visit("vramkit/core/config/settings.py", "Settings.from_config", utility=True)
    check = Visit("check.py", "check", [settings])  # a call that enters only a utility: a leaf
    root = Visit("train.py", "<module>", [Visit("run.py", "train", [check, planner])])
    route = _route(root)
    assert route.files() == ["train.py", "run.py", run_route.PLANNER]
    assert route.left_out(utility=True) == ["vramkit/core/config/settings.py"]
    assert route.left_out(utility=False) == ["check.py"]


@pytest.mark.slow
def test_a_t4_run_reaches_the_trainer_through_at_most_15_files_never_coming_back(
    tmp_path, shared_data_dir
):
    # `python train.py +hw=t4`, the command, with the device probe answering as a T4: the
    # longest route (device check, GPU plan, host check). +hw=cpu's is shorter (no GPU plan) and
    # takes four times as long under the profile hook (it builds the Trainer): the script prints it.
    env = {**os.environ, "PYTHONPATH": str(REPO), "WANDB_MODE": "disabled"}
    # nothing written into the checkout: logs and data under the test's folders
    paths = [f"paths.log_dir={tmp_path}", f"paths.data_dir={shared_data_dir}"]
    args = ["+hw=t4", "--fake-t4", *SMALL, *paths, "--json"]
    done = subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    counts = json.loads(done.stdout.strip().splitlines()[-1])
    assert counts["reached_fit"]
    assert counts["files"][:2] == ["train.py", "vramkit/core/run/run_folder_guard.py"]
    assert len(counts["files"]) <= 15, counts["files"]
    assert counts["reentries"] == [], counts["reentries"]  # back to a file only by a return
    assert counts["compositions"] <= 2, counts
