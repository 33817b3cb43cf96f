"""The built wheel, installed apart from the checkout, plans a user's module from another folder:
through the console script (`python -m vramkit.cli`) and through docs/python_api.md's example."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "python_api.md"


@pytest.mark.slow
def test_the_installed_wheel_plans_a_users_module_outside_the_checkout(tmp_path):
    pip = [sys.executable, "-m", "pip", "-q"]
    wheels, target, work = tmp_path / "wheels", tmp_path / "installed", tmp_path / "work"
    # Built from a copy of what the wheel is made of: setuptools writes build/ and *.egg-info
    # into the source folder, which must stay the checkout as cloned.
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, source / name)
    for name in ("vramkit", "conf"):
        shutil.copytree(
            REPO / name, source / name, symlinks=True, ignore=shutil.ignore_patterns("__pycache__")
        )
    subprocess.run(
        [*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(wheels), str(source)],
        check=True,
        cwd=tmp_path,
    )
    (wheel,) = wheels.glob("vramkit-*.whl")
    subprocess.run([*pip, "install", "--no-deps", "--target", str(target), str(wheel)], check=True)
    assert (target / "vramkit" / "conf" / "hw" / "t4.yaml").is_file()  # configs as package data
    # The docs' example is the user's project: its classes as my_pkg.mod, the rest as a script.
    example = re.search(r"```python\n(.*?)```", DOC.read_text(), re.S).group(1)
    classes = example.split("\nplan = ", 1)[0]
    (work / "my_pkg").mkdir(parents=True)
    (work / "my_pkg" / "__init__.py").write_text("")
    (work / "my_pkg" / "mod.py").write_text(classes)
    (work / "example.py").write_text(
        example + "\nimport json, vramkit.api\nprint(json.dumps(plan.to_json()['train']))\n"
    )
    env = {**os.environ, "PYTHONPATH": f"{target}{os.pathsep}{work}"}
    env.pop("PROJECT_ROOT", None)
    command = [sys.executable, "-m", "vramkit.cli", "plan", "--hw", "t4", "--json"]
    command += ["--model", "my_pkg.mod:MyModule", "--data", "my_pkg.mod:MyData"]
    cli = subprocess.run(command, cwd=work, env=env, capture_output=True, text=True)
    api = subprocess.run(
        [sys.executable, "example.py"], cwd=work, env=env, capture_output=True, text=True
    )
    assert cli.returncode == 0, cli.stderr
    assert api.returncode == 0, api.stderr
    plan = json.loads(cli.stdout)
    assert plan["profile"] == "t4" and plan["fits"] is True
    assert (plan["train"]["batch_size"], plan["val"]["batch_size"]) == (512, 128)  # whole sets
    *printed, train_json = api.stdout.strip().splitlines()
    assert printed[-1] == "True"
    assert json.loads(train_json) == plan["train"]  # to_json() is what --json prints
    installed = subprocess.run(
        [sys.executable, "-c", "import vramkit.api; print(vramkit.api.__file__)"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert installed.stdout.startswith(str(target))  # the wheel ran, not the checkout
