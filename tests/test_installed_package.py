"""The built wheel, installed apart from the checkout, is the product: from another folder it
plans a user's module (the console script and docs/python_api.md's example), and every documented
``vramkit`` command runs on its packaged configs and corpora: train (whose output has vramkit's
lines only), eval, export, report, compare, extract-features, the text-classification data."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.vramkit_lines import empty_folders, foreign_lines

# Building and installing the wheel takes about a minute and a half of CPU: `make test-wheel`
# runs these in one process (they share the installed wheel), after `make test` in CI.
pytestmark = [pytest.mark.slow, pytest.mark.wheel]

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "python_api.md"
# What the wheel is made of (pyproject.toml, setup.py): copied, because setuptools writes build/
# and *.egg-info into the source folder, which must stay the checkout as cloned.
WHEEL_SOURCES = ("pyproject.toml", "setup.py", "README.md", "vramkit", "conf", "corpora")


@dataclass(frozen=True)
class Installed:
    target: Path
    """The folder the wheel is installed into (``pip install --target``): package and bin/."""
    env: dict[str, str]
    """The environment that imports the installed vramkit (and the test venv's libraries)."""


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    root = tmp_path_factory.mktemp("wheel")
    pip = [sys.executable, "-m", "pip", "-q"]
    wheels, target, source = root / "wheels", root / "installed", root / "source"
    source.mkdir()
    for name in WHEEL_SOURCES:
        if (REPO / name).is_dir():
            ignore = shutil.ignore_patterns("__pycache__")
            shutil.copytree(REPO / name, source / name, symlinks=True, ignore=ignore)
        else:
            shutil.copy2(REPO / name, source / name)
    subprocess.run(
        [*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(wheels), str(source)],
        check=True,
        cwd=root,
        capture_output=True,
    )
    (wheel,) = wheels.glob("vramkit-*.whl")
    subprocess.run([*pip, "install", "--no-deps", "--target", str(target), str(wheel)], check=True)
    env = {**os.environ, "PYTHONPATH": str(target)}
    env.pop("PROJECT_ROOT", None)
    return Installed(target, env)


def test_the_installed_wheel_plans_a_users_module_outside_the_checkout(installed, tmp_path):
    target, work = installed.target, tmp_path / "work"
    conf = target / "vramkit" / "conf"
    assert (conf / "hw" / "t4.yaml").is_file() and not conf.is_symlink()  # real package files
    # The docs' example is the user's project: its classes as my_pkg.mod, the rest as a script.
    example = re.search(r"```python\n(.*?)```", DOC.read_text(), re.S).group(1)
    classes = example.split("\nplan = ", 1)[0]
    (work / "my_pkg").mkdir(parents=True)
    (work / "my_pkg" / "__init__.py").write_text("")
    (work / "my_pkg" / "mod.py").write_text(classes)
    (work / "example.py").write_text(
        example + "\nimport json, vramkit.api\nprint(json.dumps(plan.to_json()['train']))\n"
    )
    env = {**installed.env, "PYTHONPATH": f"{target}{os.pathsep}{work}"}
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
    where = subprocess.run(
        [sys.executable, "-c", "import vramkit.api; print(vramkit.api.__file__)"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert where.stdout.startswith(str(target))  # the wheel ran, not the checkout


def _vramkit(installed: Installed, work: Path, *args: str) -> subprocess.CompletedProcess:
    """``vramkit <args>`` through the wheel's console script, in `work`; stdout and stderr
    together, as a log file holds them."""
    return subprocess.run(
        [str(installed.target / "bin" / "vramkit"), *args],
        cwd=work,
        env=installed.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def test_every_documented_command_runs_from_the_wheel_outside_the_checkout(installed, tmp_path):
    work = tmp_path / "work"  # data/ and logs/ land below the current folder
    work.mkdir()
    # The default smoke run, its output a pipe (as in CI): vramkit's lines only, progress lines
    # included (at every batch here, every 30 s by default: a quiet machine trains the smoke run
    # in under a second).
    train = _vramkit(
        installed, work, "train", "debug=smoke", "callbacks.progress_line.interval_s=0.001"
    )
    assert train.returncode == 0, train.stdout
    assert foreign_lines(train.stdout) == [], train.stdout
    assert "[vramkit.core.callbacks.progress.progress_line][INFO] - step " in train.stdout
    (run,) = (work / "logs" / "text_detection" / "runs").iterdir()
    checkpoint = f"ckpt_path={run / 'checkpoints' / 'last.ckpt'}"

    smoke = ("debug=smoke", "logger=csv")
    evaluation = _vramkit(installed, work, "eval", *smoke, checkpoint)
    assert evaluation.returncode == 0, evaluation.stdout
    fast = ("export.quantize=[]", "export.exporter=torchscript")  # fp32 only: seconds
    export = _vramkit(installed, work, "export", *smoke, checkpoint, *fast)
    assert export.returncode == 0, export.stdout
    assert (work / "logs" / "text_detection" / "exports").is_dir()
    report = _vramkit(installed, work, "report", str(run))
    assert report.returncode == 0, report.stdout
    compare = _vramkit(installed, work, "compare", str(run), str(run))
    assert compare.returncode == 0, compare.stdout
    assert compare.stdout.strip().splitlines()[-1].startswith("equivalent")
    # The SAGE feature step needs a teacher run (tests/e2e/test_sage_chain.py makes one): here
    # its command and the packaged task configs answer, refusing the default task in one line.
    features = _vramkit(installed, work, "extract-features", "+hw=cpu")
    assert features.returncode == 2, features.stdout
    assert "run with task=sage_distill" in features.stdout
    # The text-classification experiment's corpus and tokenizer come with the package.
    composed = _vramkit(
        installed,
        work,
        "train",
        "experiment=phi15_coherence_tiny",
        "+hw=cpu",
        "--cfg",
        "job",
        "--resolve",
    )
    assert composed.returncode == 0, composed.stdout
    corpora = installed.target / "vramkit" / "corpora" / "topic_sentences"
    assert f"tokenizer_dir: {corpora / 'tokenizer'}" in composed.stdout
    assert (corpora / "tokenizer" / "tokenizer.json").is_file()
    assert (corpora / "train.jsonl").is_file() and (corpora / "val.jsonl").is_file()

    assert empty_folders(work) == []  # no command leaves an empty folder (wandb's tmp/code)
