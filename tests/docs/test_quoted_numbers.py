"""The numbers README.md and docs/ quote are what the commands print today.

Every fenced block that starts with ``$ python scripts/plan_memory.py +hw=t4`` is compared, row by
row, with a real run of that command, and the batch size the README says the settled config
(``plan_memory.py +hw=t4 --print-config``) prints is checked against that command. A planner
change that moves a number fails here until the page says the new one.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PLAN_COMMAND = "python scripts/plan_memory.py +hw=t4"
BOX_CHARACTERS = "│┃┏┓┗┛┡┩└┘┳┻╇━─"


def _run(*args: str, data_dir: Path, log_dir: Path) -> str:
    # The commands as the pages quote them, writing their data and logs under pytest's tmp paths.
    paths = (f"paths.data_dir={data_dir}", f"paths.log_dir={log_dir}")
    done = subprocess.run(
        [sys.executable, args[0], *paths, *args[1:]],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def _rows(text: str) -> dict[str, list[str]]:
    """Table rows of a plan's first table: label -> cells, box drawing ignored."""
    rows = {}
    for line in text.splitlines():
        cells = [c for c in re.split(r"\s{2,}", line.strip(BOX_CHARACTERS + " ")) if c]
        cells = [c.strip(BOX_CHARACTERS + " ") for c in cells]
        cells = [c for c in cells if c]
        if len(cells) >= 3 and cells[0] not in rows:  # a label and one cell per phase
            rows[cells[0]] = cells[1:]
        if line.startswith("what holds"):
            break
    return rows


def _fenced_blocks(text: str) -> list[str]:
    """The contents of the page's fenced code blocks, fences paired line by line."""
    blocks, current = [], None
    for line in text.splitlines():
        if line.startswith("```"):
            if current is None:
                current = []
            else:
                blocks.append("\n".join(current))
                current = None
        elif current is not None:
            current.append(line)
    return blocks


def _quoted_plan_blocks() -> list[tuple[Path, str]]:
    blocks = []
    for page in PAGES:
        for block in _fenced_blocks(page.read_text()):
            command = block.split("\n", 1)[0].split("#")[0].split()
            if command == ["$", *PLAN_COMMAND.split()]:
                blocks.append((page, block))
    return blocks


@pytest.fixture(scope="module")
def t4_plan(shared_data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> str:
    logs = tmp_path_factory.mktemp("logs")
    return _run("scripts/plan_memory.py", "+hw=t4", data_dir=shared_data_dir, log_dir=logs)


def test_the_pages_quote_the_t4_plan_somewhere():
    assert _quoted_plan_blocks(), f"no block starting with '$ {PLAN_COMMAND}' in README or docs/"


def test_every_quoted_t4_plan_table_is_what_the_planner_prints(t4_plan):
    printed = _rows(t4_plan)
    assert "peak" in printed, t4_plan
    for page, block in _quoted_plan_blocks():
        quoted = _rows(block)
        assert quoted, f"{page.name}: no table rows in the quoted plan"
        for label, cells in quoted.items():
            assert printed.get(label) == cells, (
                f"{page.name} quotes {label!r} as {cells}; the planner prints {printed.get(label)}"
            )


def test_the_readme_batch_size_is_what_the_settled_config_prints(
    t4_plan, shared_data_dir, tmp_path
):
    readme = (ROOT / "README.md").read_text()
    quoted = re.search(r"prints `data\.batch_size: (\d+)`", readme)
    assert quoted, "README no longer quotes the resolved batch size"
    resolved = _run(
        "scripts/plan_memory.py",
        "+hw=t4",
        "--print-config",
        data_dir=shared_data_dir,
        log_dir=tmp_path,
    )
    data_node = resolved.split("\ndata:\n", 1)[1]
    printed = re.search(r"^  batch_size: (\d+)$", data_node, flags=re.M)
    assert printed and printed.group(1) == quoted.group(1)
    train_batch = re.search(r"train batch (\d+)", t4_plan)
    assert train_batch and train_batch.group(1) == quoted.group(1)
