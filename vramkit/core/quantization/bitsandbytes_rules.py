"""Which bitsandbytes a plan models, the versions its rules were read from, and what changed.

The planner never imports bitsandbytes (its import loads CUDA libraries and prints warnings); it
reads the installed version from the package metadata, or, where bitsandbytes is not installed
(a CPU machine planning for a GPU one), applies the rules of the newest tested release.

Version rules (each checked against the tagged sources of
github.com/bitsandbytes-foundation/bitsandbytes):

- up to 0.43.1 `MatMul4Bit.forward` kept every 4-bit layer's input for backward
  (``ctx.tensors = (A, B)`` in `bitsandbytes/autograd/_functions.py`), although the frozen
  weight never gets a gradient: one activation per 4-bit layer. Fixed by PR #1270 ("fix QLoRA
  mem bug: delete useless buffered activation", commit 9e75374104cec965d9a4a630a68ce4e2b77b066f,
  merged 2024-07-16), first released in 0.43.2 (``ctx.tensors = (None, B)``).
- the 8-bit optimizers' block-wise states have one fp32 absmax per 2048 elements up to 0.43.3
  (``blocks = n // 2048`` in `bitsandbytes/optim/optimizer.py`, `init_state`) and per 256 from
  0.44.0 (PR #1365, "Change 8bit optimizer blocksize 2048->256", commit aa57bd89).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import metadata

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

TESTED_BITSANDBYTES = ">=0.41,<0.51"
"""bitsandbytes releases whose sources the planner's rules were read from and checked against:
0.41-0.43.1 (the input kept) and 0.43.2-0.50.2 (the packed weight only)."""

NEWEST_TESTED_BITSANDBYTES = "0.50.2"
"""The release whose rules a plan applies where bitsandbytes is not installed."""

FIRST_OPTIMIZER_BLOCK_256 = Version("0.44.0")
"""The first release whose 8-bit optimizers scale blocks of 256 elements (2048 before)."""

LAST_KEEPING_4BIT_INPUT = Version("0.43.1")
"""The last release whose `MatMul4Bit` saved its input for backward (PR #1270 fixed it)."""

_override: list[str] = []


@dataclass(frozen=True)
class PlannedBitsandbytes:
    """The bitsandbytes release whose rules a plan applies, and where that choice came from."""

    version: str
    origin: str
    """"installed", "not installed: the newest tested" or "stated by the caller"."""

    def footer(self) -> str:
        """The plan's line naming the rules it applied."""
        return f"4-bit/8-bit rules of bitsandbytes {self.version} ({self.origin})"

    def warning(self) -> str | None:
        """One line when the version is outside `TESTED_BITSANDBYTES`, else None."""
        try:
            inside = SpecifierSet(TESTED_BITSANDBYTES).contains(
                Version(self.version), prereleases=False
            )
        except InvalidVersion:
            inside = False
        if inside:
            return None
        return (
            f"warning: bitsandbytes {self.version} is outside the tested range "
            f"bitsandbytes{TESTED_BITSANDBYTES}: its quantized layers and optimizers may hold "
            f"more or less than planned; install bitsandbytes=={NEWEST_TESTED_BITSANDBYTES} or "
            "compare this plan with a measured run"
        )


def installed_bitsandbytes() -> str | None:
    """The installed bitsandbytes version, read from its metadata (not imported); None if absent."""
    try:
        return metadata.version("bitsandbytes")
    except metadata.PackageNotFoundError:
        return None


def planned_bitsandbytes() -> PlannedBitsandbytes:
    """The release whose rules plans apply now: the one `bitsandbytes_rules_of` states, else the
    installed one, else `NEWEST_TESTED_BITSANDBYTES`."""
    if _override:
        return PlannedBitsandbytes(_override[-1], "stated by the caller")
    installed = installed_bitsandbytes()
    if installed is not None:
        return PlannedBitsandbytes(installed, "installed")
    return PlannedBitsandbytes(NEWEST_TESTED_BITSANDBYTES, "not installed: the newest tested")


@contextlib.contextmanager
def bitsandbytes_rules_of(version: str) -> Iterator[None]:
    """Plan with the rules of bitsandbytes `version` inside the block (a published measurement's
    release, or the one the GPU machine will run), whatever is installed here."""
    Version(version)  # refuse a malformed version before planning with it
    _override.append(version)
    try:
        yield
    finally:
        _override.pop()


def keeps_4bit_input(version: str) -> bool:
    """Whether bitsandbytes `version`'s 4-bit matmul saves its input for backward (<= 0.43.1)."""
    return Version(version) <= LAST_KEEPING_4BIT_INPUT


def optimizer_8bit_block(version: str) -> int:
    """Elements per fp32 absmax of bitsandbytes `version`'s 8-bit optimizer states."""
    return 256 if Version(version) >= FIRST_OPTIMIZER_BLOCK_256 else 2048
