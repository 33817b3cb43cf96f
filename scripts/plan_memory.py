"""Plan a training run's GPU memory on any machine, before launching it.

    python scripts/plan_memory.py +hw=t4 [any train.py override] [--json]

Composes the config exactly as `python train.py` does, takes the hardware profile as the
target (no device check: a T4 plan is made on a laptop CPU), builds the task's datamodule and
LightningModule, traces two optimizer steps and a validation step on fake tensors, and prints
the breakdown per phase against the profile's budget, with remedies when it does not fit.
"auto" batch sizes are searched: the largest that fit. `--json` prints one JSON object.

    python scripts/plan_memory.py +hw=t4 [any train.py override] --print-config

prints the run's config instead: the user's config settled for the profile's own hardware
(`vramkit.core.run.settling.settle`: auto batch sizes planned, the automatic fit's remedy applied)
and
composed again with the settlement's overrides, resolved, as `python train.py` on that hardware
runs it. (`python train.py … --cfg job --resolve` shows the config before settlement: `auto`.)
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from vramkit.core.run.long_lived_imports import long_lived_imports

with long_lived_imports(freeze=__name__ == "__main__"):
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from vramkit.core.hardware.profile import ProfileError
    from vramkit.core.planner import PlanningError, plan_json, plan_table, plan_task
    from vramkit.core.run.library_chatter import hide_library_chatter, output_settings
    from vramkit.core.run.settling.compose import CONF_DIR, compose_config
    from vramkit.core.run.settling.plan_request_from_config import plan_request
    from vramkit.core.run.settling.resolve_hardware import requested_profile
    from vramkit.core.run.settling.settle import settle
from vramkit.core.run.settling.compose import settled_config


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        epilog="Other arguments are Hydra overrides, as for train.py: +hw=t4 model=dbnet_r18 …",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument(
        "--no-remedies", action="store_true", help="skip planning remedies when it does not fit"
    )
    parser.add_argument(
        "--print-config",
        action="store_true",
        help="print the run's config after settlement (batch sizes planned), not the plan",
    )
    return parser.parse_known_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Print the plan; exit status 0 when it fits (or there is no budget), 1 when it does not."""
    args, overrides = parse_args(argv)
    try:
        cfg = compose_config("train", overrides)
        # other libraries' chatter off unless verbose=true (a bad value: exit 2 below)
        hide_library_chatter(output_settings(cfg.get("verbose"), config_file="conf/train.yaml"))
        if args.print_config:
            # Settled for the profile's own hardware: a T4's run, printed on a laptop's CPU.
            settlement = settle(cfg, check_device=False, user_overrides=overrides)
            print(OmegaConf.to_yaml(settled_config(settlement), resolve=True), end="")
            return 0
        profile = requested_profile(cfg, conf_dir=CONF_DIR).profile
        plan = plan_task(plan_request(cfg, profile, with_remedies=not args.no_remedies))
    except (
        ProfileError,
        PlanningError,
        ValueError,
        FileNotFoundError,  # an input the task needs, e.g. SAGE's teacher checkpoint
        HydraException,
        OmegaConfBaseException,
    ) as error:
        print(f"plan_memory: error: {error}", file=sys.stderr)
        return 2
    print(json.dumps(plan_json(plan), indent=2) if args.json else plan_table(plan))
    return 1 if plan.fits is False else 0


def _exit_now(status: int) -> None:
    """End the process without the interpreter's teardown.

    Tearing down the thousands of modules torch, Lightning and transformers import, and the
    objects a trace leaves, costs about a second of CPU time after the plan is printed; the
    plan holds no files or connections that need closing (`benchmarks/plan_speed.py`).
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


if __name__ == "__main__":
    _exit_now(main())
