"""The comment beside each pin in pyproject.toml lists exactly the private names that the
library's compat module uses."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import vramkit
from tests.core.compat.private_name_scan import private_names_used

REPO = Path(vramkit.__file__).resolve().parents[1]
COMPAT = REPO / "vramkit" / "core" / "compat"
DISTRIBUTIONS = {
    "lightning": "lightning",
    "torch": "torch",
    "hydra": "hydra-core",
    "omegaconf": "omegaconf",
}
_PRIVATE_NAME = re.compile(r"(?<!\w)_[A-Za-z]\w*")


def pin_comment(pyproject: str, distribution: str) -> str:
    """The comment lines right above the pin of ``distribution``, joined."""
    lines = pyproject.splitlines()
    pin = next(i for i, line in enumerate(lines) if line.strip().startswith(f'"{distribution}>'))
    start = pin
    while start > 0 and lines[start - 1].strip().startswith("#"):
        start -= 1
    return " ".join(line.strip().lstrip("#").strip() for line in lines[start:pin])


def names_listed(comment: str, module_file: str) -> set[str]:
    """The private names the comment lists after it names ``module_file``."""
    _, named, listed = comment.partition(f"vramkit/core/compat/{module_file}")
    assert named, f"the pin comment does not name vramkit/core/compat/{module_file}: {comment!r}"
    return set(_PRIVATE_NAME.findall(listed))


@pytest.mark.parametrize("library", sorted(DISTRIBUTIONS))
def test_each_pin_comment_lists_what_its_compat_module_uses(library):
    module_file = f"{library}_private.py"
    used = private_names_used((COMPAT / module_file).read_text())
    comment = pin_comment((REPO / "pyproject.toml").read_text(), DISTRIBUTIONS[library])
    assert used, module_file
    assert names_listed(comment, module_file) == used


def test_a_name_missing_from_a_comment_is_seen():
    pyproject = (
        "dependencies = [\n"
        "    # Private names used, all in vramkit/core/compat/hydra_private.py: Job._other.\n"
        '    "hydra-core>=1.3.8,<1.4",\n'
    )
    listed = names_listed(pin_comment(pyproject, "hydra-core"), "hydra_private.py")
    used = private_names_used((COMPAT / "hydra_private.py").read_text())
    assert listed == {"_other"} != used
