"""The torch versions and builds the project is tested on, and what a plan says outside them.

The planner reaches torch's private APIs (fake tensors, dispatcher guards, `Library._destroy`,
autocast internals) and its CUDA rules were read from the sources of these versions: on any other
torch a plan may be wrong without any error. `TESTED_TORCH` is the requirement `pyproject.toml`
gives pip (a test checks they are the same string), so pip refuses a torch outside it at install.
"""

from __future__ import annotations

import torch
from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

TESTED_TORCH = ">=2.13,<2.15"
"""torch versions CI runs the suite on: 2.13.0 (CPU build) and 2.14.1 (CUDA 13.0 build)."""

NEWEST_TESTED_TORCH = "2.14.1"
"""The newest tested release: what `make install` puts on a machine with an NVIDIA driver."""


def torch_build(cuda_version: str | None = None) -> str:
    """ "CUDA 13.0 build" or "CPU build" for `cuda_version` (default: the installed torch's)."""
    cuda = torch.version.cuda if cuda_version is None else cuda_version
    return f"CUDA {cuda} build" if cuda else "CPU build"


def is_cuda_build() -> bool:
    """Whether the installed torch was built with CUDA (true without any GPU present)."""
    return torch.version.cuda is not None


def modelled_torch() -> str:
    """Which torch's CUDA rules a plan applies, for its footer.

    A GPU run uses a CUDA build: on one, its own autocast op lists are read; on a CPU build, the
    table of docs/cuda_rules.md for the CUDA build of the same version.
    """
    if is_cuda_build():
        return f"CUDA rules of torch {torch.__version__} (autocast lists read from it)"
    release = ".".join(str(part) for part in Version(torch.__version__).release[:2])
    return f"CUDA rules of torch {release}'s CUDA build (autocast lists from vramkit's table)"


def untested_torch_warning(version: str | None = None) -> str | None:
    """One line when `version` (default: the installed torch's) is outside `TESTED_TORCH`.

    A pre-release, nightly or source build ("2.14.0a0+git…") counts as outside: none was tested.
    """
    installed = torch.__version__ if version is None else version
    try:
        inside = SpecifierSet(TESTED_TORCH).contains(Version(installed), prereleases=False)
    except InvalidVersion:
        inside = False
    if inside:
        return None
    return (
        f"warning: torch {installed} is outside the tested range torch{TESTED_TORCH}: the "
        f"planner's private torch APIs and CUDA rules were checked on those releases only; "
        f"install torch=={NEWEST_TESTED_TORCH} or compare this plan with a measured run"
    )
