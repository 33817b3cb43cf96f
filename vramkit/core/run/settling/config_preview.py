"""``--cfg job --resolve`` shows the config as composed, before the run settles its hardware.

The trainer, data and model configs read the profile as plain ``${hw.<field>}``; with no
``+hw=<profile>`` on the command line the run detects its profile while settling, so the composed
config has no ``hw`` node and OmegaConf would end the preview with a traceback
(``InterpolationKeyError``). ``refuse_preview_without_profile`` says so in one line first.

A key the YAML leaves to its settings class (``???``) composes as ``${settings_default:…}``
(`vramkit.core.config.settings_schemas`); Hydra prints ``--cfg`` unresolved unless ``--resolve``
(hydra/_internal/hydra.py ``show_cfg``), so `show_class_defaults` makes such a preview compose
the class defaults as values: what the user reads is the number, not the interpolation.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from vramkit.core.config.settings_schemas import register_settings_schemas
from vramkit.core.run.settling.resolvers import CONF_DIR

_PROFILE_PREFIXES = ("+hw=", "++hw=")

_PRINTING_FLAGS = ("--cfg", "-c", "--info", "-i")
"""Hydra's flags that print the composed config instead of running (hydra/_internal/utils.py
``get_args_parser``)."""


def prints_config(argv: Sequence[str]) -> bool:
    """Whether the command line `argv` asks Hydra to print the config (``--cfg``, ``--info``)."""
    return any(arg.split("=", 1)[0] in _PRINTING_FLAGS for arg in argv)


def show_class_defaults(argv: Sequence[str], conf_dir: Path = CONF_DIR) -> None:
    """When `argv` prints the config, compose class defaults as values (module doc); a run's
    composition keeps them as interpolations, read when the component is built."""
    if prints_config(argv):
        register_settings_schemas(conf_dir, as_values=True)


def preview_problem(argv: Sequence[str], conf_dir: Path = CONF_DIR) -> str | None:
    """Why the command line `argv` cannot show a resolved preview, or None when it can."""
    if "--resolve" not in argv or any(arg.startswith(_PROFILE_PREFIXES) for arg in argv):
        return None
    profiles = ", ".join(sorted(path.stem for path in (Path(conf_dir) / "hw").glob("*.yaml")))
    return (
        "error: --resolve shows the config before the run settles its hardware, and no "
        f"+hw=<profile> was given for its ${{hw.…}} values to read: add one ({profiles}), or "
        "print a run's settled config with python scripts/plan_memory.py +hw=<profile> "
        "--print-config"
    )


def refuse_preview_without_profile(argv: Sequence[str], conf_dir: Path = CONF_DIR) -> None:
    """Exit with status 2 and one line when `argv` asks ``--resolve`` with no ``+hw=`` profile."""
    problem = preview_problem(argv, conf_dir)
    if problem is not None:
        print(problem, file=sys.stderr)
        raise SystemExit(2)
