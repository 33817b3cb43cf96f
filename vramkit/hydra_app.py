"""A vramkit command that is a Hydra app: ``vramkit train``, ``eval``, ``export``,
``extract-features`` (and the scripts over them)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any


def hydra_app(
    config_name: str,
    run: Callable[[Any], Any],
    argv: Sequence[str],
    *,
    job_name: str | None = None,
) -> int:
    """Run `run` as ``@hydra.main`` over the packaged ``conf/<config_name>.yaml`` with `argv`
    as the command line, as train.py and eval.py do; Hydra's job (and log file) is `job_name`,
    by default `config_name`."""
    import hydra

    from vramkit.core.run.refusal.exit_codes import refusals_as_messages
    from vramkit.core.run.refusal.override_typos import did_you_mean_on_refusal
    from vramkit.core.run.settling.compose import CONF_DIR
    from vramkit.core.run.settling.config_preview import preview_problem, show_class_defaults
    from vramkit.core.run.settling.resolvers import register_resolvers

    register_resolvers()
    problem = preview_problem(argv)
    if problem is not None:  # --resolve with no +hw= profile for ${hw.…} to read
        print(problem, file=sys.stderr)
        return 2
    show_class_defaults(argv)  # --cfg job prints class defaults as values

    def main(cfg: Any) -> Any:
        with refusals_as_messages():
            return run(cfg)

    # Hydra names the job after the task function's module: train.py's and eval.py's log file
    # (`train.log`, `eval.log`) in the run folder, not `cli.log`.
    main.__module__ = job_name or config_name
    app = hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name=config_name)(main)
    saved_argv = sys.argv
    sys.argv = [f"vramkit {config_name}", *argv]  # Hydra reads its command line from sys.argv
    try:
        with did_you_mean_on_refusal(config_name):
            app()
    except SystemExit as stop:
        return stop.code if isinstance(stop.code, int) else 1
    finally:
        sys.argv = saved_argv
    return 0
